// Fuzz target: the estimate entry point on fuzzed plans. Bytes decode into a Plan over a zoo model (sizes drawn
// mostly from plausible values, sometimes raw 32-bit integers); check_plan judges it, and every valid plan gets
// estimate_memory and estimate (memory + time), whose numbers must all be finite and non-negative.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "fuzz/fuzz_util.h"
#include "common/data_dir.h"
#include "common/user_error.h"
#include "models/zoo.h"

namespace {

using namespace lcplan;

struct World {
  std::vector<ModelSpec> models;
  std::vector<Hardware> hardware;
  std::vector<Calibration> calibrations;
};

const World& world() {
  static const World w = [] {
    World w;
    const std::string dir = data_dir();
    for (const auto& n : zoo_names(dir)) w.models.push_back(load_model(n, dir));
    for (const auto& n : hardware_names(dir)) w.hardware.push_back(load_hardware(n, dir));
    const Calibration profile = load_calibration("default", dir);
    for (const char* n : {"megatron", "bumblebee"}) {
      w.calibrations.push_back(calibration_for(profile, "h100-sxm-80gb", n));
      w.calibrations.back().name = n;
    }
    w.calibrations.push_back(load_calibration("priors", dir));
    w.calibrations.back().name = "lcplan-exec";
    return w;
  }();
  return w;
}

// Mostly small plausible values (so valid plans are common), sometimes anything a 32-bit field can hold.
int draw_int(fuzz::ByteReader& r, std::initializer_list<int> usual) {
  const uint8_t b = r.byte();
  if (b >= 240) return static_cast<int>(r.u32());
  return usual.begin()[b % usual.size()];
}

void check_breakdown(const MemoryBreakdown& b) {
  for (const MemoryCategoryInfo& c : kMemoryCategories)
    fuzz::require(fuzz::finite_nonneg(b.*c.member), "every memory term is finite and non-negative");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const World& w = world();
  fuzz::ByteReader r{data, size};
  const ModelSpec& m = w.models[r.byte() % w.models.size()];
  const Hardware& hw = w.hardware[r.byte() % w.hardware.size()];
  const Calibration& cal = w.calibrations[r.byte() % w.calibrations.size()];
  Plan p;
  p.model = m.name;
  p.hardware = hw.name;
  p.implementation = cal.name;
  p.parallel.tp = draw_int(r, {1, 2, 4, 8, 1, 2, 0, 3, 16});
  p.parallel.pp = draw_int(r, {1, 2, 4, 1, 3, 8, 16, 0});
  p.parallel.vpp = draw_int(r, {1, 1, 2, 3, 4, 0});
  p.parallel.cp = draw_int(r, {1, 2, 4, 8, 1, 16, 0, 3});
  p.parallel.ep = draw_int(r, {1, 2, 4, 8, 16, 32, 64, 0, 3});
  p.parallel.etp = draw_int(r, {1, 1, 2, 4, 0});
  const int dp = draw_int(r, {1, 2, 4, 8, 16, 3, 64});
  // gpus usually a multiple of tp*pp*cp (computed in double so huge draws cannot overflow the harness itself).
  const double gpus = (r.byte() & 7) ? double(p.parallel.tp) * p.parallel.pp * p.parallel.cp * dp
                                     : double(draw_int(r, {8, 32, 7, 0, 1024}));
  p.gpus = (gpus > INT32_MAX || gpus < INT32_MIN) ? 0 : static_cast<int>(gpus);
  p.gpus_per_node = draw_int(r, {0, 8, 4, 72, 0});
  static const int64_t seqs[] = {4096, 8192, 32768, 65536, 131072, 262144, 1048576, 4194304, 1000, 0, 12288};
  if (r.byte() >= 250) {
    const int64_t base = r.u32();  // its own statement: the operands of `*` have no defined evaluation order
    p.seq_len = base * (r.byte() + 1);
  } else {
    p.seq_len = r.pick(seqs);
  }
  p.micro_batch = draw_int(r, {1, 1, 2, 4, 8, 0});
  p.global_batch = draw_int(r, {0, 0, 64, 128, 256, 1024, 96, 1});
  p.precision = static_cast<Precision>(r.byte() % 4);
  p.sequence_parallel = r.byte() & 1;
  p.optimizer_sharding = static_cast<OptimizerSharding>(r.byte() % 3);
  p.recompute = static_cast<Recompute>(r.byte() % 3);
  p.recompute_layers = draw_int(r, {0, 0, 1, 2, 3, 5, -1});
  p.offload.optimizer = r.byte() & 1;
  p.offload.activations = (r.byte() % 4) == 0;
  p.linear_ce = r.byte() & 1;
  p.moe.ep_chunks = draw_int(r, {1, 1, 2, 3, 4, 8, 9, 0});
  static const double imbalance[] = {1.0, 1.0, 1.25, 1.5, 2.0, 64.0, 0.5, 65.0};
  p.moe.routing_imbalance = r.pick(imbalance);
  static const double capacity[] = {0, 0, 1.0, 1.25, 2.0, 0.5, -1.0};
  p.moe.capacity_factor = r.pick(capacity);

  if (check_plan(m, p)) return 0;  // rejected with a rule: fine
  const MemoryEstimate mem = estimate_memory(m, p, hw, cal);
  fuzz::require(fuzz::finite_nonneg(mem.peak_bytes) && mem.peak_bytes > 0, "peak memory is finite and positive");
  fuzz::require(int(mem.stages.size()) == p.parallel.pp, "one memory record per pipeline stage");
  for (const auto& s : mem.stages) {
    check_breakdown(s.breakdown);
    fuzz::require(s.peak_bytes <= mem.peak_bytes, "the peak is the maximum over stages");
  }
  const Estimate e = estimate(m, p, hw, cal);
  fuzz::require(e.memory.peak_bytes == mem.peak_bytes, "estimate() reports the same peak as estimate_memory()");
  const TimeEstimate& t = e.time;
  fuzz::require(std::isfinite(t.step_seconds) && t.step_seconds > 0, "step time is finite and positive");
  for (double x : {t.model_flops_per_step, t.tflops_per_gpu, t.mfu, t.tokens_per_second_per_gpu, t.breakdown.compute,
                   t.breakdown.recompute, t.breakdown.exposed_comm.tp, t.breakdown.exposed_comm.cp,
                   t.breakdown.exposed_comm.ep, t.breakdown.exposed_comm.pp, t.breakdown.exposed_comm.dp_fsdp,
                   t.breakdown.bubble, t.breakdown.launch_overhead, t.breakdown.optimizer})
    fuzz::require(fuzz::finite_nonneg(x), "every time term is finite and non-negative");
  for (double x : {t.phases.forward, t.phases.loss, t.phases.backward, t.phases.optimizer})
    fuzz::require(fuzz::finite_nonneg(x), "every phase's seconds are finite and non-negative");
  fuzz::require(std::abs(t.phases.total() - t.step_seconds) <= 1e-9 * t.step_seconds, "the phases sum to the step");
  (void)estimate_to_json(e, p).dump();
  return 0;
}
