// Full searches with every dimension free. Targets (issue 26): Qwen3.5-35B-A3B on 32 GPUs at 128K within 30 ms,
// DeepSeek-V3 on 1,024 GPUs within 0.25 s, on one quiet core of the development machine (bench/record.sh keeps the
// medians). The search walks what the plan's framework runs: Megatron-LM has no chunked EP, so the DeepSeek-V3 search
// under "megatron" walks a quarter of the candidates it walks under "bumblebee" (chunks 1-4). Reports plans per second.
#include <benchmark/benchmark.h>

#include "estimator/hardware.h"
#include "common/data_dir.h"
#include "models/zoo.h"
#include "search/search.h"

namespace {

void BM_Search(benchmark::State& state, const char* model, int gpus, int64_t seq, const char* framework) {
  const std::string dir = lcplan::data_dir();
  const lcplan::ModelSpec m = lcplan::load_model(model, dir);
  const lcplan::Hardware hw = lcplan::load_hardware("h100-sxm-80gb", dir);
  const lcplan::Calibration cal = lcplan::calibration_for(lcplan::load_calibration("default", dir), "h100-sxm-80gb", framework);
  lcplan::Plan base;
  base.model = model;
  base.gpus = gpus;
  base.gpus_per_node = hw.gpus_per_node;
  base.seq_len = seq;
  base.global_batch = gpus;
  base.implementation = framework;
  const lcplan::PlanSpace space = lcplan::default_space(m, base);
  lcplan::SearchOptions opt;
  opt.headroom_bytes = 4.0 * (1 << 30);
  size_t candidates = 0, evaluated = 0;
  for (auto _ : state) {
    const lcplan::SearchResult r = lcplan::search_plans(m, base, space, hw, cal, opt);
    candidates = r.candidates;
    evaluated = r.evaluated;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["candidates"] = double(candidates);
  state.counters["evaluated"] = double(evaluated);
  state.counters["plans/s"] = benchmark::Counter(double(candidates) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["estimated/s"] = benchmark::Counter(double(evaluated) * state.iterations(), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Search, qwen35_35b_32gpu_128k, "qwen3.5-35b-a3b", 32, 131072, "megatron")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, qwen35_35b_32gpu_128k_bumblebee, "qwen3.5-35b-a3b", 32, 131072, "bumblebee")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_4k, "deepseek-v3", 1024, 4096, "megatron")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_4k_bumblebee, "deepseek-v3", 1024, 4096, "bumblebee")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_128k, "deepseek-v3", 1024, 131072, "megatron")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
