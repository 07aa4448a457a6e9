// One full estimate (memory + time) of one plan; target: under 5 microseconds per plan.
#include <cstdlib>

#include <benchmark/benchmark.h>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/time_model.h"
#include "models/zoo.h"

namespace {

std::string data() {
  const char* env = std::getenv("LCPLAN_DATA_DIR");
  return env && *env ? env : LCPLAN_SOURCE_DIR;
}

void run(benchmark::State& state, const char* model, lcplan::Plan p) {
  const lcplan::ModelSpec m = lcplan::load_model(model, data());
  const lcplan::Hardware hw = lcplan::load_hardware("h100-sxm-80gb", data());
  const lcplan::Calibration cal = lcplan::calibration_for(lcplan::load_calibration("default", data()), hw.name, p.implementation);
  p.model = model;
  for (auto _ : state) {
    const lcplan::DerivedPlan d = lcplan::derive_plan(m, p, hw);  // once per plan, as the search does
    auto mem = lcplan::estimate_memory(d, cal);
    auto t = lcplan::estimate_time(d, hw, cal);
    benchmark::DoNotOptimize(mem.peak_bytes);
    benchmark::DoNotOptimize(t.step_seconds);
  }
}

void BM_Qwen35_ChunkedEp(benchmark::State& state) {
  lcplan::Plan p;
  p.gpus = 32;
  p.seq_len = 131072;
  p.parallel.ep = 8;
  p.parallel.cp = 4;
  p.recompute = lcplan::Recompute::Full;
  p.optimizer_sharding = lcplan::OptimizerSharding::Fsdp;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  p.implementation = "bumblebee";
  run(state, "qwen3.5-35b-a3b", p);
}
BENCHMARK(BM_Qwen35_ChunkedEp);

void BM_Llama70B_Pp8Vpp5(benchmark::State& state) {
  lcplan::Plan p;
  p.gpus = 64;
  p.seq_len = 8192;
  p.global_batch = 256;
  p.precision = lcplan::Precision::FP8;
  p.parallel.tp = 4;
  p.parallel.pp = 8;
  p.parallel.vpp = 5;
  run(state, "llama-3.1-70b", p);
}
BENCHMARK(BM_Llama70B_Pp8Vpp5);

void BM_Qwen3_235B_1024Gpus(benchmark::State& state) {
  lcplan::Plan p;
  p.gpus = 1024;
  p.seq_len = 32768;
  p.parallel.tp = 2;
  p.parallel.pp = 2;
  p.parallel.ep = 32;
  p.parallel.cp = 4;
  run(state, "qwen3-235b-a22b", p);
}
BENCHMARK(BM_Qwen3_235B_1024Gpus);

}  // namespace

BENCHMARK_MAIN();
