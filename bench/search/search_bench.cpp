// Full searches with every dimension free. Targets (issue 26): Qwen3.5-35B-A3B on 32 GPUs at 128K within 30 ms,
// DeepSeek-V3 on 1,024 GPUs within 0.25 s, on one quiet core of the development machine (bench/record.sh keeps the
// medians). The search walks what the plan's framework runs: Megatron-LM has no chunked EP, so the DeepSeek-V3 search
// under "megatron" walks a quarter of the candidates it walks under "bumblebee" (chunks 1-4). Reports plans per second.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "estimator/hardware.h"
#include "common/data_dir.h"
#include "models/zoo.h"
#include "search/batch_search.h"
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

// Issue 29's target: a search over a 1,000-bucket length histogram within 3x of the fixed-length search of the same
// case (BM_Search qwen35_35b_32gpu_128k_bumblebee). The histogram: a lognormal of median 16K capped at 128K in 1,000
// distinct lengths (fixed draws), as the rollouts of a long-context RL run; the search's own defaults otherwise.
struct BatchCase {
  lcplan::ModelSpec m;
  lcplan::Hardware hw;
  lcplan::Calibration cal;
  lcplan::LengthDistribution dist;
  lcplan::Plan base;
};

const BatchCase& batch_case() {
  static const BatchCase c = [] {
    const std::string dir = lcplan::data_dir();
    BatchCase b{lcplan::load_model("qwen3.5-35b-a3b", dir), lcplan::load_hardware("h100-sxm-80gb", dir),
                lcplan::calibration_for(lcplan::load_calibration("default", dir), "h100-sxm-80gb", "bumblebee"), {}, {}};
    std::mt19937_64 rng(29);
    std::normal_distribution<double> z(std::log(16384.0), 1.0);
    std::map<int64_t, double> counts;
    while (counts.size() < 1000) counts[std::clamp<int64_t>(int64_t(std::exp(z(rng))), 256, 131072)] += 1;
    for (const auto& [l, n] : counts) b.dist.lengths.push_back(l), b.dist.weights.push_back(n);
    b.base.model = "qwen3.5-35b-a3b";
    b.base.gpus = 32;
    b.base.gpus_per_node = b.hw.gpus_per_node;
    b.base.seq_len = 131072;
    b.base.global_batch = 32;
    b.base.implementation = "bumblebee";
    return b;
  }();
  return c;
}

lcplan::BatchSearchResult run_batch_search(const lcplan::BatchSearchKnobs& knobs) {
  const BatchCase& c = batch_case();
  lcplan::SearchOptions opt;
  opt.headroom_bytes = 4.0 * (1 << 30);
  return lcplan::search_batches(c.m, c.base, lcplan::default_space(c.m, c.base), c.hw, c.cal, opt, c.dist,
                                lcplan::PackingOptions{}, knobs);
}

void BM_BatchSearch(benchmark::State& state) {
  size_t searches = 0, candidates = 0;
  for (auto _ : state) {
    const lcplan::BatchSearchResult r = run_batch_search({});
    searches = r.searches;
    candidates = r.candidates;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["searches"] = double(searches);
  state.counters["candidates"] = double(candidates);
}

// The search's knobs (search/batch_search.h BatchSearchKnobs): plans re-ranked per fixed search and steps drawn to
// rank them. Time, and the chosen plan's expected tokens/s over all the options' steps (the same plan reads the
// same number), so a cheaper setting that picks a worse plan shows it.
void BM_BatchSearchKnobs(benchmark::State& state) {
  const lcplan::BatchSearchKnobs knobs{int(state.range(0)), int(state.range(1))};
  double best = 0;
  for (auto _ : state) {
    const lcplan::BatchSearchResult r = run_batch_search(knobs);
    best = r.top.empty() ? 0 : r.top.front().batches.tokens_per_second_per_gpu;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["best_tok/s/GPU"] = best;
}

BENCHMARK_CAPTURE(BM_Search, qwen35_35b_32gpu_128k, "qwen3.5-35b-a3b", 32, 131072, "megatron")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, qwen35_35b_32gpu_128k_bumblebee, "qwen3.5-35b-a3b", 32, 131072, "bumblebee")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_4k, "deepseek-v3", 1024, 4096, "megatron")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_4k_bumblebee, "deepseek-v3", 1024, 4096, "bumblebee")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BatchSearch)->Name("BM_BatchSearch/qwen35_35b_32gpu_1000_lengths")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BatchSearchKnobs)->ArgsProduct({{1, 2, 3, 5}, {1, 2, 4, 8}})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Search, deepseek_v3_1024gpu_128k, "deepseek-v3", 1024, 131072, "megatron")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
