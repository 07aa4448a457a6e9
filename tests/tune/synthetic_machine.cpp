// A machine whose behaviour the tune tests know: `synthetic_machine --plan P --out O --truth CALIBRATION [--seed N]`
// "runs" plan P by estimating it under a hidden true calibration and writes the measurement record lcplan-exec would
// (step time, peak bytes) to O; a plan whose estimated peak exceeds the hardware's memory writes an out-of-memory
// record instead. Repeated runs differ by a seeded, deterministic +-2% (a hash of the plan and the seed), so a tune
// test passes or fails for a reason, never for the load on the machine that runs it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "calibrate/measurement.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"

namespace {

using namespace lcplan;

// FNV-1a: the same plan and seed give the same wobble on every machine and build.
uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

int run(int argc, char** argv) {
  std::string plan_path, out, truth;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--plan") plan_path = v;
    else if (k == "--out") out = v;
    else if (k == "--truth") truth = v;
    else if (k == "--seed") seed = std::stoull(v);
    else throw UserError("unknown flag " + k + " (valid: --plan, --out, --truth, --seed)");
  }
  if (plan_path.empty() || out.empty() || truth.empty()) throw UserError("give --plan, --out and --truth");
  const std::string dir = LCPLAN_SOURCE_DIR;
  // As lcplan-exec reads a run's plan: the model and hardware paths are relative to the recipe (estimator/plan.h).
  const Plan plan = load_plan_file(plan_path);
  const ModelSpec model = model_for_plan(load_model(plan.model, dir), plan);
  require_valid_plan(model, plan);
  const Hardware hw = load_hardware(plan.hardware, dir);
  const Calibration cal = calibration_for(load_calibration(truth, dir), hw.name, plan.implementation);
  const Estimate e = estimate(model, plan, hw, cal);
  Measurement m;
  m.id = "synthetic";
  m.source = "tests/tune/synthetic_machine.cpp";
  m.plan = plan;
  if (e.memory.peak_bytes > hw.hbm_bytes) {
    m.status = MeasurementStatus::OutOfMemory;
    m.failure = "CUDA out of memory (synthetic machine: estimated peak above the hardware's memory)";
  } else {
    // The noise depends on the plan, not on where its files lie (a fresh clone's random folder).
    Plan key = plan;
    key.model = std::filesystem::path(key.model).stem().string();
    key.hardware = std::filesystem::path(key.hardware).stem().string();
    const double unit = double(fnv1a(plan_to_json(key).dump(), seed) % 100000) / 100000.0;  // [0, 1)
    m.step_seconds = e.time.step_seconds * (1 + 0.04 * (unit - 0.5));
    m.peak_bytes = e.memory.peak_bytes;
  }
  write_file_atomic(out, nlohmann::json::array({measurement_to_json(m)}).dump(2) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synthetic_machine: %s\n", e.what());
    return 2;
  }
}
