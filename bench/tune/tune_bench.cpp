// lcplan tune's own cost per round, without the runs (issue 14 target: under a second per round for a 32-GPU
// search): rank under the current calibration, refit to the measured runs, rank again, serialize the log. The runs
// are instant stand-ins whose step time departs from the profile's prediction by a growing factor; Qwen3.5-35B-A3B, 32 H100s, 128K, every
// dimension free, 3 plans per round, 4 rounds (12 runs by the last round).
#include <benchmark/benchmark.h>

#include "calibrate/calibrate_fit.h"
#include "common/data_dir.h"
#include "estimator/hardware.h"
#include "models/zoo.h"
#include "search/search.h"
#include "tune/refit.h"
#include "tune/tune_hooks.h"
#include "tune/tune_log.h"
#include "tune/tune_loop.h"

namespace {

using namespace lcplan;

void BM_TuneRounds(benchmark::State& state) {
  const std::string dir = data_dir();
  const ModelSpec m = load_model("qwen3.5-35b-a3b", dir);
  const Hardware hw = load_hardware("h100-sxm-80gb", dir);
  Calibration cal = calibration_for(load_calibration("default", dir), hw.name, "megatron");
  cal.per_hardware.clear();
  cal.per_implementation.clear();
  const std::vector<std::string> keys = {"time.gemm_efficiency", "time.attention_efficiency", "time.grouped_gemm_efficiency",
                                         "time.a2a_nvlink_efficiency", "time.step_overhead_seconds"};
  Plan base;
  base.model = "qwen3.5-35b-a3b";
  base.gpus = 32;
  base.gpus_per_node = 8;
  base.seq_len = 131072;
  base.global_batch = 32;
  base.implementation = "megatron";
  const PlanSpace space = default_space(m, base);
  // The tune's real hooks (tune/tune_hooks.h), with instant stand-ins for the runs.
  TuneSetup setup;
  setup.model = m;
  setup.hardware = hw;
  setup.base = base;
  setup.space = default_space(m, base);
  setup.search.headroom_bytes = 4.0 * (1 << 30);
  setup.refit.keys = keys;
  setup.start = cal;
  setup.data_dir = dir;
  TuneHooks h = make_tune_hooks(setup);
  h.run = [&](const RankedPlan& p, int index) {
    TuneRun r;
    r.measured.id = "run " + std::to_string(index);
    r.measured.plan = p.plan;
    // The machine disagrees with the profile by plan (-3% per run index: each new run beats the predicted best), so the ranking keeps moving.
    r.measured.step_seconds = p.predicted_seconds * (1 - 0.03 * index);
    return r;
  };
  const nlohmann::json request = {{"bench", 1}};
  h.on_round = [&](const TuneState& s) { benchmark::DoNotOptimize(tune_log_json(request, s).dump()); };
  TuneOptions opt;
  opt.plans_per_round = 3;
  opt.max_runs = 12;
  opt.max_rounds = 4;
  opt.tie = 0;  // run every round (a stable stop would end the benchmark early)
  size_t rounds = 0;
  for (auto _ : state) {
    TuneState s;
    s.calibration = cal;
    run_tune(s, h, opt);
    rounds += s.rounds.size();
  }
  state.counters["rounds"] = double(rounds) / double(state.iterations());
  state.counters["s/round"] =
      benchmark::Counter(double(rounds), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_TuneRounds)->Unit(benchmark::kMillisecond)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
