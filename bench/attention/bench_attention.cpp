// CPU benchmark of the two attention kernels the executor calls, forward + backward per iteration:
//   softmax attention (kernels/attention): FLOPs = 14 * Hq * D * visible (query, key) pairs (forward 4, backward 10;
//     causal counts the lower triangle with its diagonal, S (S + 1) / 2 pairs per head);
//   gated delta rule (kernels/linear_attention): FLOPs = S * Hv * (forward_flops_per_token + backward_flops_per_token)
//     (linear_attention_math.h: 6 dk dv + C (3 dk + 2 dv) + C^2/3 forward, 34 dk dv + C (2 dk + dv) + C^2/3 backward
//     as implemented).
// Time is process CPU time (std::clock) fed to Google Benchmark as manual time, like bench_linear_ce: the machine may
// be shared and the kernels are single-threaded. Counters: GFLOP/s and the peak extra MB of the two calls.
//   bench_attention [google benchmark flags, e.g. --benchmark_filter=gated --benchmark_min_time=2x]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/linear_attention/linear_attention.h"

namespace at = lcplan::attention;
namespace la = lcplan::linear_attention;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& e : x) e = nd(rng);
  return x;
}

void report(benchmark::State& st, double flops, double total, int64_t iters, size_t peak) {
  st.counters["GFLOP/s"] = total > 0 ? flops * double(iters) / total / 1e9 : 0.0;
  st.counters["peak_extra_MB"] = double(peak) / 1e6;
}

void attention_case(benchmark::State& st, int64_t seq, int64_t hq, int64_t hkv, int64_t d, int64_t window) {
  const at::Shape s{seq, seq, hq, hkv, d};
  at::Options o;
  o.causal = true;
  o.window = window;
  const auto q = randn(size_t(seq * hq * d), 1), k = randn(size_t(seq * hkv * d), 2), v = randn(size_t(seq * hkv * d), 3),
             d_o = randn(size_t(seq * hq * d), 4);
  std::vector<float> out(q.size()), lse(size_t(hq * seq)), dq(q.size()), dk(k.size()), dv(v.size());
  at::Stats fs, bs;
  double total = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    const std::clock_t t0 = std::clock();
    at::forward_cpu(s, q.data(), k.data(), v.data(), out.data(), lse.data(), o, &fs);
    at::backward_cpu(s, q.data(), k.data(), v.data(), out.data(), lse.data(), d_o.data(), dq.data(), dk.data(),
                     dv.data(), o, &bs);
    benchmark::DoNotOptimize(dq.data());
    benchmark::ClobberMemory();
    const double sec = double(std::clock() - t0) / CLOCKS_PER_SEC;
    st.SetIterationTime(sec);
    total += sec;
    ++iters;
  }
  const double pairs = at::visible_pairs(s, o);
  report(st, at::forward_flops(double(hq), double(d), pairs) + at::backward_flops(double(hq), double(d), pairs), total,
         iters, std::max(fs.peak_extra_bytes, bs.peak_extra_bytes));
}

void gated_delta_case(benchmark::State& st, int64_t seq, int64_t hk, int64_t hv, int64_t dk, int64_t dv, int64_t chunk) {
  const la::Shape s{seq, hk, hv, dk, dv};
  la::Options o;
  o.chunk = chunk;
  const auto q = randn(size_t(seq * hk * dk), 1), k = randn(size_t(seq * hk * dk), 2), v = randn(size_t(seq * hv * dv), 3);
  std::vector<float> g(size_t(seq * hv)), beta(size_t(seq * hv));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> ug(-1.0f, -0.01f), ub(0.05f, 0.95f);
  for (auto& x : g) x = ug(rng);
  for (auto& x : beta) x = ub(rng);
  const auto d_o = randn(size_t(seq * hv * dv), 6);
  std::vector<float> out(d_o.size()), state(size_t(hv * dk * dv)), dq(q.size()), dkk(k.size()), dvv(v.size()),
      dg(g.size()), db(beta.size()), ds0(state.size());
  la::Stats fs, bs;
  double total = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    const std::clock_t t0 = std::clock();
    la::forward_cpu(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, out.data(), state.data(), o, &fs);
    la::backward_cpu(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, d_o.data(), nullptr, dq.data(),
                     dkk.data(), dvv.data(), dg.data(), db.data(), ds0.data(), o, &bs);
    benchmark::DoNotOptimize(dq.data());
    benchmark::ClobberMemory();
    const double sec = double(std::clock() - t0) / CLOCKS_PER_SEC;
    st.SetIterationTime(sec);
    total += sec;
    ++iters;
  }
  const double c = double(std::min(chunk, seq));
  const double per_token = la::forward_flops_per_token(double(dk), double(dv), c) +
                           la::backward_flops_per_token(double(dk), double(dv), c);
  report(st, double(seq) * double(hv) * per_token, total, iters, std::max(fs.peak_extra_bytes, bs.peak_extra_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Softmax attention: Qwen3.5-style GQA (8 query heads over 2 kv heads) at head dim 128 and 256.
  for (const int64_t seq : {1024, 4096}) {
    const std::string name = "attention_causal/S=" + std::to_string(seq) + "/Hq=8/Hkv=2/D=128";
    benchmark::RegisterBenchmark(name.c_str(), [seq](benchmark::State& s) { attention_case(s, seq, 8, 2, 128, 0); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("attention_causal/S=2048/Hq=4/Hkv=1/D=256",
                               [](benchmark::State& s) { attention_case(s, 2048, 4, 1, 256, 0); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("attention_causal_window1024/S=4096/Hq=8/Hkv=2/D=128",
                               [](benchmark::State& s) { attention_case(s, 4096, 8, 2, 128, 1024); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  // Gated delta rule: Qwen3.5's dk = dv = 128, two value heads per key head, chunk 64.
  for (const int64_t seq : {1024, 4096}) {
    const std::string name = "gated_delta/S=" + std::to_string(seq) + "/Hk=2/Hv=4/dk=128/dv=128/C=64";
    benchmark::RegisterBenchmark(name.c_str(),
                                 [seq](benchmark::State& s) { gated_delta_case(s, seq, 2, 4, 128, 128, 64); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
