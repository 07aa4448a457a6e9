// One memory estimate (all stages, all phases) of the reference plan; the search evaluates millions.
// Target (issue 2): under 2 microseconds per plan on the development machine.
#include <benchmark/benchmark.h>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "common/data_dir.h"
#include "models/zoo.h"

namespace {

void BM_MemoryEstimate(benchmark::State& state, const char* model, int gpus, int tp, int pp, int cp, int ep) {
  const lcplan::ModelSpec m = lcplan::load_model(model, lcplan::data_dir());
  const lcplan::Calibration cal =
      lcplan::calibration_for(lcplan::load_calibration("default", lcplan::data_dir()), "h100-sxm-80gb", "bumblebee");
  const lcplan::Hardware hw = lcplan::load_hardware("h100-sxm-80gb", lcplan::data_dir());
  lcplan::Plan p;
  p.model = model;
  p.gpus = gpus;
  p.seq_len = 131072;
  p.parallel = {tp, pp, 1, cp, ep, 1};
  p.optimizer_sharding = lcplan::OptimizerSharding::Fsdp;
  p.recompute = lcplan::Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  // The derived record is part of the cost: the search derives every plan it estimates.
  for (auto _ : state) benchmark::DoNotOptimize(lcplan::estimate_memory(lcplan::derive_plan(m, p, hw), cal));
  state.counters["plans/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_MemoryEstimate, qwen35_35b_pp1, "qwen3.5-35b-a3b", 32, 1, 1, 4, 8);
BENCHMARK_CAPTURE(BM_MemoryEstimate, qwen35_35b_pp4, "qwen3.5-35b-a3b", 32, 1, 4, 4, 8);
BENCHMARK_CAPTURE(BM_MemoryEstimate, deepseek_v3_pp1, "deepseek-v3", 1024, 2, 1, 4, 64);
BENCHMARK_CAPTURE(BM_MemoryEstimate, llama_405b_pp8, "llama-3.1-405b", 1024, 8, 8, 2, 1);

}  // namespace

BENCHMARK_MAIN();
