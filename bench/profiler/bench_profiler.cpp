// What `lcplan profile` itself costs beside the kernels it times (Google Benchmark, CPU time):
//  - per repeat: the steady-clock timing of one repeat (time_repeats on one rank with an empty body), and on GPUs the
//    CUPTI bookkeeping of one repeat (build_trace + per-stream union/overlap over its activity records);
//  - per case: fitting its points (saturating curve, alpha-beta), deriving every coefficient from a full set of
//    tables, and writing the tables as JSON.
#include <benchmark/benchmark.h>

#include <cmath>

#include "profiler/activity.h"
#include "profiler/fit.h"
#include "profiler/profile_data.h"
#include "profiler/timing.h"

namespace {

using namespace lcplan::profiler;

// One rank: time_repeats makes no MPI call.
lcplan::comm::Comm one_rank() {
  lcplan::comm::Comm c;
  c.size = 1;
  return c;
}

void BM_TimeRepeatsPerRepeat(benchmark::State& st) {
  const lcplan::comm::Comm c = one_rank();
  RepeatOptions o;
  o.warmup = 0;
  o.repeats = int(st.range(0));
  volatile int sink = 0;
  for (auto _ : st) benchmark::DoNotOptimize(time_repeats(c, o, [&] { sink = sink + 1; }));
  st.SetItemsProcessed(st.iterations() * st.range(0));  // items = repeats: time per item = overhead per repeat
}
BENCHMARK(BM_TimeRepeatsPerRepeat)->Arg(5)->Arg(100);

// One repeat's CUPTI records: a chunked MoE layer pass issues ~40 kernels on two streams; a GEMM case a handful.
std::vector<ActivityBuffer> records(int n) {
  ActivityBuffer b;
  uint64_t t = 1000;
  for (int i = 0; i < n; ++i) {
    b.records.push_back({ActivityKind::Kernel, 0, uint32_t(i % 2 ? 7 : 13), t, t + 5000, 0, "kernel", 0});
    t += 3000;
  }
  return {b};
}

void BM_TraceBookkeepingPerRepeat(benchmark::State& st) {
  const std::vector<ActivityBuffer> bufs = records(int(st.range(0)));
  for (auto _ : st) {
    const Trace t = build_trace(bufs);
    benchmark::DoNotOptimize(overlap_summary(t.of(13), t.of(7)));
  }
  st.SetItemsProcessed(st.iterations() * st.range(0));
}
BENCHMARK(BM_TraceBookkeepingPerRepeat)->Arg(4)->Arg(40)->Arg(400);

void BM_FitCurvePerCase(benchmark::State& st) {
  std::vector<double> x, y;
  for (double t = 16; t <= 32768; t *= 2) x.push_back(t), y.push_back(0.6 * t / (t + 300) * (1 + 0.01 * std::sin(t)));
  for (auto _ : st) benchmark::DoNotOptimize(fit_saturating(x, y));
}
BENCHMARK(BM_FitCurvePerCase);

void BM_FitAlphaBetaPerCase(benchmark::State& st) {
  std::vector<double> x, t;
  for (double b = 1024; b <= (1 << 30); b *= 2) x.push_back(b), t.push_back(1e-5 + b / 1e11);
  for (auto _ : st) benchmark::DoNotOptimize(fit_alpha_beta(x, t));
}
BENCHMARK(BM_FitAlphaBetaPerCase);

// A full profile's tables (the default GPU sweep's row counts) for the derivation and the JSON.
ProfileData full_tables() {
  ProfileData d;
  for (int c = 0; c < 3; ++c)
    for (int64_t m = 64; m <= 32768; m *= 2)
      for (const char* type : {"bf16", "fp8"}) d.gemm.push_back({m, 4096, 4096, type, "c", 2e-12 * double(m) * 4096 * 4096 / 4e14});
  for (int64_t t = 16; t <= 8192; t *= 2) d.grouped.push_back({16, t, 4096, 1536, 1e-3});
  for (int64_t s = 512; s <= 16384; s *= 2) d.attention.push_back({s, 16, 4, 128, 4.0 * 16 * 128 * s * s / 2, 1e-2});
  for (int64_t s = 1024; s <= 16384; s *= 2) d.linear_attention.push_back({s, 16, 32, 128, 128, 1e11, 1e-2});
  d.linear_ce.push_back({4096, 4096, 65536, 8192, 4096, "bf16", 1.3e-2, 1e-2});
  for (int k = 1; k <= 2; ++k) d.moe.push_back(MoeRow{});
  for (double b = 8192; b <= (512 << 20); b *= 2)
    for (Coll c : {Coll::AllToAll, Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce, Coll::SendRecv})
      d.collectives.push_back({"node", 8, 1, lcplan::LinkTier::NVLink, c, b, 1e-5 + b / 3e11});
  for (double b : {64e6, 256e6, 1e9}) d.copy.push_back({b, 2 * b / 3e12});
  d.launch.push_back({"k", 3e-6});
  return d;
}

void BM_DeriveAllCoefficients(benchmark::State& st) {
  const ProfileData d = full_tables();
  lcplan::Hardware hw;
  hw.name = "h100-sxm-80gb";
  hw.peak_bf16_flops = 989e12, hw.peak_fp8_flops = 1979e12, hw.hbm_bandwidth = 3.35e12;
  hw.nvlink_bandwidth = 450e9, hw.network_bandwidth = 50e9, hw.host_bandwidth = 64e9;
  lcplan::Calibration start;
  start.linear_ce_vocab_tile = 8192;
  for (auto _ : st) benchmark::DoNotOptimize(derive_coefficients(d, hw, start));
}
BENCHMARK(BM_DeriveAllCoefficients);

void BM_TablesToJson(benchmark::State& st) {
  const ProfileData d = full_tables();
  for (auto _ : st) benchmark::DoNotOptimize(to_json(d).dump());
}
BENCHMARK(BM_TablesToJson);

}  // namespace

BENCHMARK_MAIN();
