// Fuzz target: Megatron-LM training logs (parse_megatron_log) -> a measurement record (megatron_measurement).
// Valid or UserError; an accepted record is one lcplan calibrate reads back (measurement_from_json), with positive
// finite measured values, and "out_of_memory" exactly when the log holds a CUDA out-of-memory line.
#include <cstdint>
#include <string>

#include "calibrate/measurement.h"
#include "calibrate/megatron_log.h"
#include "common/user_error.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const MegatronLog log = parse_megatron_log(text);
  Plan plan;
  plan.model = "qwen3-30b-a3b";
  plan.gpus = 32;
  plan.seq_len = 4096;
  plan.global_batch = 64;
  IngestOptions opt;
  opt.id = "fuzz";
  opt.file = "fuzz.log";
  opt.skip_iterations = size % 3;
  nlohmann::json rec;
  try {
    rec = megatron_measurement(log, plan, opt);
  } catch (const UserError&) {
    return 0;
  }
  Measurement m;
  try {
    m = measurement_from_json(rec, "fuzz");
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fuzz::require(false, "a record megatron_measurement writes is accepted by measurement_from_json");
  }
  fuzz::require((m.status == MeasurementStatus::OutOfMemory) == (log.failure == RunFailure::OutOfMemory),
                "out_of_memory exactly for a log with a CUDA out-of-memory line");
  for (const auto& v : {m.peak_bytes, m.step_seconds, m.tflops_per_gpu})
    if (v) fuzz::require(fuzz::finite_nonneg(*v) && *v > 0, "measured values are positive and finite");
  return 0;
}
