// Benchmark, not a test (it times real runs): measured step time of lcplan-exec against the estimate of the same
// scaled plan on this machine's CPU profile (data/hardware/cpu-amd-epyc-2c.json, data/calibration/cpu-measured.json
// with its lcplan-exec overrides; its peaks scaled to this host's speed re-timed now, host_speed): per phase
// (forward, loss, backward, optimizer) printed with its error. The README's bounds (25% for dense plans, 40% for MoE
// plans) are what the table is read against; with LCPLAN_BENCH_OUT=FILE rank 0 appends each case's numbers to FILE
// (one JSON object per line) for bench/record.py. Run: mpirun -np 2 build/release/bench/executor/exec_time_bench.
//
// Noise: the profile was measured with 2 ranks on this 2-core machine, so every plan runs on 2 ranks (one core each)
// and the test runs alone (RUN_SERIAL). The first step is a warm-up (first touch of every buffer, MPI connections).
// Of the later steps, those where every rank's main thread got at least kUndisturbed of the step's wall time in CPU
// time are the undisturbed ones (waits poll, so a rank alone on its core gets ~all of it); of those the fastest is
// compared, because other processes on a shared machine only ever add time. When no step was undisturbed (another
// build took the cores) the table is printed and the step not asserted: the wall times then measure the other load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "calibrate/validate_run.h"
#include "common/json_file.h"
#include "executor/record.h"
#include "kernels/comm/helpers.h"
#include "profiler/device.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

constexpr double kTolerance = 0.25;  // the README's bound on the step time
// The MoE plans' bound: their steps measured +11% to +17% on 2026-11-23 and +17% to +34% in five runs on
// 2026-11-24, while the dense plans in the same runs read +2% to +19%, and neither the profile's own copy nor its
// GEMM re-timed beside them ran slower than when profiled (README "Known gaps"). The 25% holds for them only
// on some days.
constexpr double kMoeTolerance = 0.40;
constexpr int kSteps = 5;            // one warm-up and four timed steps
constexpr double kUndisturbed = 0.9; // least CPU / wall share of every rank in a step counted as undisturbed

Hardware cpu_hardware() { return load_hardware("cpu-amd-epyc-2c", LCPLAN_SOURCE_DIR); }
// The CPU profile as `lcplan validate --hardware cpu-amd-epyc-2c --calibration cpu-measured` resolves it.
Calibration cpu_calibration() {
  return calibration_for(load_calibration("cpu-measured", LCPLAN_SOURCE_DIR), "cpu-amd-epyc-2c", "lcplan-exec");
}

// This host's speed against the profiled one's: the profile's fastest GEMM (fp32, 1024 x 1024 x 1024) re-timed now,
// on every rank at once, with the profiler's own CPU device (profiler/device_cpu.cpp), as `lcplan profile` timed it.
// The profile's peaks, which every efficiency and the executor's overrides are relative to, are scaled by that one
// ratio, so the comparison tests the time model's coefficients rather than which host the test landed on: on
// 2026-11-26 the same build ran every phase 15-35% faster than the profile (a faster host; the GEMM re-timed 1.3-1.4x),
// on 2026-11-24 20% slower. One ratio for compute and memory terms alike: lcplan-exec's "memory-bound" terms are
// computed by the same cores (its optimizer step measured compute-bound, data/calibration/cpu-measured.json), while
// a re-timed 128 MB copy read 1.6x to 3.1x within one minute (bandwidth shared with the host's neighbours).
double host_speed(const comm::Comm& world) {
  const nlohmann::json tables = read_json_file(std::string(LCPLAN_SOURCE_DIR) + "/data/calibration/cpu-measured.json",
                                               "CPU profile")["profile"]["tables"];
  double profiled = 0;
  for (const auto& r : tables.at("gemm"))
    if (r.at("type") == "fp32" && r.at("m") == 1024 && r.at("n") == 1024 && r.at("k") == 1024)
      profiled = r.at("seconds").get<double>();
  if (profiled <= 0) throw std::runtime_error("the CPU profile has no fp32 1024^3 GEMM row");
  const std::unique_ptr<profiler::Device> dev = profiler::make_cpu_device(world, {1, 9});  // the median of 9
  return profiled / dev->gemm(1024, 1024, 1024, "fp32").seconds;  // > 1: this host is faster
}

class TimeTable : public ::testing::TestWithParam<ExecCase> {};

TEST_P(TimeTable, StepAgainstItsEstimate) {
  helpers::World w;
  const ExecCase& tc = GetParam();
  ASSERT_EQ(w.c.size, tc.args.gpus) << "run this test with mpirun -np " << tc.args.gpus << " (one group per job)";
  const ScaledCase sc = executor_case(zoo(tc.model), make_plan(tc.model, tc.args), {tc.scale, tc.layers});
  ExecOptions o;
  o.steps = kSteps;
  const ExecResult r = run_case(w.c, sc, o);
  ASSERT_EQ(r.step_seconds.size(), size_t(kSteps));
  auto share = [&](size_t i) { return r.step_cpu_seconds[i] / r.step_seconds[i]; };
  size_t best = 0;  // the fastest undisturbed step after the warm-up, else (0) the fastest later step
  for (size_t i = 1; i < r.step_seconds.size(); ++i)
    if (share(i) >= kUndisturbed && (best == 0 || r.step_seconds[i] < r.step_seconds[best])) best = i;
  const bool undisturbed = best != 0;
  if (!undisturbed) {
    best = 1;
    for (size_t i = 2; i < r.step_seconds.size(); ++i)
      if (r.step_seconds[i] < r.step_seconds[best]) best = i;
  }
  // The record lcplan-exec would write, with the fastest later step in place of the median (see the file comment);
  // compare() estimates the plan at the run's routing load, as `lcplan validate` does.
  Measurement rec = measurement_record(sc, o, r, "test");
  rec.step_seconds = r.step_seconds[best];
  for (int ph = 0; ph < kPhases; ++ph)
    if (rec.phases[ph]) rec.phases[ph]->seconds = r.step_phase_seconds[best][size_t(ph)];
  const double speed = host_speed(w.c);
  Hardware hw = cpu_hardware();
  hw.peak_bf16_flops *= speed;
  hw.peak_fp8_flops *= speed;
  hw.hbm_bandwidth *= speed;
  const Comparison c = compare(sc.model, sc.plan, hw, cpu_calibration(), rec);

  if (w.c.rank == 0) {
    std::printf("%s (%s, scale %d, seq %lld, hidden %lld, %zu layers; steps", tc.name, tc.model, tc.scale,
                (long long)sc.plan.seq_len, (long long)sc.model.hidden, sc.model.layers.size());
    for (size_t i = 0; i < r.step_seconds.size(); ++i)
      std::printf(" %.3f (cpu %.0f%%)", r.step_seconds[i], 100 * share(i));
    std::printf(" s; step %zu compared)\n  this host's GEMM against the profile's: x%.2f (the profile's peaks scaled by "
                "it)\n  %-10s %10s %10s %8s\n", best + 1, speed, "phase", "estimate", "measured", "error");
    for (const TimeRow& t : c.time)
      std::printf("  %-10s %10.4f %10.4f %+7.1f%%\n", to_string(t.phase), t.estimate, t.measured.value_or(0),
                  100 * t.rel().value_or(0));
    double in_phases = 0;
    for (double x : r.step_phase_seconds[best]) in_phases += x;
    // Each measured phase is its slowest rank's, so their sum can exceed the step (the slowest rank's whole step).
    std::printf("  %-10s %10.4f %10.4f %+7.1f%%   (measured phases sum to %.4f)\n  estimate's breakdown %s\n", "step",
                c.estimate_step_seconds, *c.measured_step_seconds,
                100 * (*c.measured_step_seconds / c.estimate_step_seconds - 1), in_phases,
                c.estimate_time.at("breakdown").dump().c_str());
    if (c.estimate_bubble_seconds)
      std::printf("  %-10s %10.4f %10.4f %+7.1f%%   (least time a rank waited on others: fill and drain)\n",
                  "pp bubble", *c.estimate_bubble_seconds, c.measured_pipeline_wait_seconds.value_or(0),
                  100 * (c.measured_pipeline_wait_seconds.value_or(0) / *c.estimate_bubble_seconds - 1));
  }
  const bool moe = sc.model.moe.num_experts > 0;
  const double error = *c.measured_step_seconds / c.estimate_step_seconds - 1;
  if (w.c.rank == 0) {
    std::printf("  %s: %+.1f%% against a bound of %.0f%%%s\n", tc.name, 100 * error, 100 * (moe ? kMoeTolerance : kTolerance),
                undisturbed ? "" : " (no undisturbed step: other processes shared the cores)");
    if (const char* out = std::getenv("LCPLAN_BENCH_OUT"))
      std::ofstream(out, std::ios::app) << nlohmann::json{{"bench", "exec_time"}, {"case", tc.name},
                                                          {"estimate_seconds", c.estimate_step_seconds},
                                                          {"measured_seconds", *c.measured_step_seconds},
                                                          {"error", error}, {"undisturbed", undisturbed},
                                                          {"host_speed", speed}}.dump() << "\n";
  }
}

// Two ranks each (the profile's ranks per node). At scale 16 GEMMs (dense layers, experts, LM head) take most of
// a step of about a second (perf: 75-90% of each phase), so kernels, not per-call overheads, are compared; a case
// runs in 6-9 s.
INSTANTIATE_TEST_SUITE_P(
    Plans, TimeTable,
    ::testing::Values(
        ExecCase{"dense_dp2", "llama-3.1-8b", {.gpus = 2, .seq = 16384}, 16, 2},
        ExecCase{"dense_cp2", "llama-3.1-8b", {.gpus = 2, .cp = 2, .seq = 32768}, 16, 2},
        ExecCase{"dense_dp2_full_recompute", "llama-3.1-8b",
                 {.gpus = 2, .seq = 16384, .recompute = Recompute::Full}, 16, 2},
        ExecCase{"dense_pp2", "llama-3.1-8b", {.gpus = 2, .global_batch = 4, .pp = 2, .seq = 8192}, 16, 2},
        ExecCase{"moe_ep2_chunked", "mixtral-8x7b", {.gpus = 2, .ep = 2, .ep_chunks = 2, .seq = 16384}, 16, 2},
        ExecCase{"moe_ep2_full_recompute", "qwen3.5-35b-a3b",
                 {.gpus = 2, .ep = 2, .ep_chunks = 2, .seq = 16384, .recompute = Recompute::Full}, 16, 1},
        ExecCase{"mla_tp2", "deepseek-v3", {.gpus = 2, .tp = 2, .seq = 16384}, 16, 1}),
    [](const ::testing::TestParamInfo<ExecCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace lcplan::exec::tests
