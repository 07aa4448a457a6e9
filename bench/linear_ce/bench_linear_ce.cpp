// CPU benchmark: linear CE (streamed over vocabulary tiles) vs the materialised-logits baseline, forward + backward.
// Reports time, GFLOP/s (8NHV per step) and peak extra bytes, then prints the time and memory ratios per size.
// Every number comes from one clock, the process CPU time (std::clock): it is fed to Google Benchmark as manual
// time, so its time column, GFLOP/s and the ratio table agree.
//   bench_linear_ce [--tokens=N] [--hidden=H] [--vocab=V1,V2,...] [--dtype=fp32|bf16] [--vocab-tile=T]
//                   [--token-tile=T] [--no-naive] [--preset=issue] [google benchmark flags...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/linear_ce/linear_ce.h"

namespace lc = lcplan::linear_ce;

namespace {

// CUTLASS-example style options: parsed from our own flags, the rest goes to Google Benchmark.
struct BenchOptions {
  int64_t tokens = 512;
  int64_t hidden = 512;
  std::vector<int64_t> vocabs = {32768, 131072};
  lc::DType dtype = lc::DType::F32;
  int64_t vocab_tile = 2048;
  int64_t token_tile = 256;
  bool naive = true;
  bool help = false;

  static void print_usage() {
    std::printf(
        "bench_linear_ce: CPU linear cross-entropy vs materialised logits (forward + backward)\n"
        "  --tokens=N          tokens (default 512)\n"
        "  --hidden=H          hidden size (default 512)\n"
        "  --vocab=V1,V2,...   vocabulary sizes (default 32768,131072)\n"
        "  --dtype=fp32|bf16   input dtype (default fp32)\n"
        "  --vocab-tile=T      vocabulary tile (default 2048)\n"
        "  --token-tile=T      token tile (default 256)\n"
        "  --no-naive          skip the materialised baseline\n"
        "  --preset=issue      issue 5's sizes: 4096 tokens x 2048 hidden x vocab 32K,64K,128K,256K. Opt-in:\n"
        "                      minutes per size on one core, and the baseline holds the fp32 tokens x vocab logits\n"
        "                      (4.3 GB at 256K) on top of a 2.1 GB fp32 weight and its gradient; add --no-naive on\n"
        "                      small machines. Flags after it override its sizes.\n"
        "  other flags go to Google Benchmark (e.g. --benchmark_min_time=2x)\n");
  }

  // Consumes the flags it knows from argv; returns false with a message on a malformed one.
  bool parse(int& argc, char** argv) {
    int out = 1;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto val = [&](const char* key) -> const char* {
        const size_t k = std::strlen(key);
        return a.compare(0, k, key) == 0 ? argv[i] + k : nullptr;
      };
      try {
        if (const char* v = val("--tokens=")) tokens = std::stoll(v);
        else if (const char* v = val("--hidden=")) hidden = std::stoll(v);
        else if (const char* v = val("--vocab-tile=")) vocab_tile = std::stoll(v);
        else if (const char* v = val("--token-tile=")) token_tile = std::stoll(v);
        else if (const char* v = val("--vocab=")) {
          vocabs.clear();
          std::stringstream ss(v);
          for (std::string tok; std::getline(ss, tok, ',');) vocabs.push_back(std::stoll(tok));
        } else if (const char* v = val("--dtype=")) {
          if (std::strcmp(v, "bf16") == 0) dtype = lc::DType::BF16;
          else if (std::strcmp(v, "fp32") == 0) dtype = lc::DType::F32;
          else throw std::invalid_argument(v);
        } else if (const char* v = val("--preset=")) {
          if (std::strcmp(v, "issue") != 0) throw std::invalid_argument(v);
          tokens = 4096;
          hidden = 2048;
          vocabs = {32768, 65536, 131072, 262144};
        } else if (a == "--no-naive") naive = false;
        else if (a == "--help" || a == "-h") help = true;
        else argv[out++] = argv[i];
      } catch (const std::exception&) {
        std::fprintf(stderr, "bench_linear_ce: cannot parse %s\n", argv[i]);
        return false;
      }
    }
    argc = out;
    return true;
  }
};

struct Inputs {
  std::vector<float> e, w;
  std::vector<lc::bf16> e16, w16;
  std::vector<int64_t> targets;
  lc::DType dtype;
  const void* hidden() const { return dtype == lc::DType::BF16 ? static_cast<const void*>(e16.data()) : e.data(); }
  const void* weight() const { return dtype == lc::DType::BF16 ? static_cast<const void*>(w16.data()) : w.data(); }
};

Inputs make_inputs(int64_t n, int64_t h, int64_t v, lc::DType t) {
  Inputs in;
  in.dtype = t;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in.e.resize(n * h);
  in.w.resize(v * h);
  for (auto& x : in.e) x = nd(rng);
  for (auto& x : in.w) x = nd(rng) * 3.0f / std::sqrt(float(h));
  if (t == lc::DType::BF16) {
    for (float x : in.e) in.e16.push_back(lc::float_to_bf16(x));
    for (float x : in.w) in.w16.push_back(lc::float_to_bf16(x));
  }
  std::uniform_int_distribution<int64_t> tv(0, v - 1);
  for (int64_t i = 0; i < n; ++i) in.targets.push_back(i % 10 == 0 ? -100 : tv(rng));
  return in;
}

struct Measured {
  double seconds = 0;
  size_t peak = 0;
};

void run_case(benchmark::State& st, const BenchOptions& bo, int64_t v, bool naive, Measured* m) {
  const int64_t n = bo.tokens, h = bo.hidden;
  const Inputs in = make_inputs(n, h, v, bo.dtype);
  lc::Options o;
  o.vocab_tile = bo.vocab_tile;
  o.token_tile = bo.token_tile;
  const lc::Problem p{n, h, v};
  const size_t es = lc::dtype_bytes(bo.dtype);
  std::vector<char> dh(n * h * es), dw(v * h * es);
  float loss = 0, one = 1;
  std::vector<float> lse(n);
  lc::Stats fs, bs;
  double total = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    const std::clock_t t0 = std::clock();  // process CPU time: the machine may be shared and the kernel is 1-thread
    if (naive) {
      lc::forward_naive_cpu(p, bo.dtype, in.hidden(), in.weight(), in.targets.data(), &loss, lse.data(), o, &fs);
      lc::backward_naive_cpu(p, bo.dtype, in.hidden(), in.weight(), in.targets.data(), lse.data(), &one, dh.data(),
                             dw.data(), o, &bs);
    } else {
      lc::forward_cpu(p, bo.dtype, in.hidden(), in.weight(), in.targets.data(), &loss, lse.data(), o, &fs);
      lc::backward_cpu(p, bo.dtype, in.hidden(), in.weight(), in.targets.data(), lse.data(), &one, dh.data(),
                       dw.data(), o, &bs);
    }
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
    const double sec = double(std::clock() - t0) / CLOCKS_PER_SEC;
    st.SetIterationTime(sec);
    total += sec;
    ++iters;
  }
  const size_t peak = std::max(fs.peak_extra_bytes, bs.peak_extra_bytes);
  const double flops = lc::forward_flops(n, h, v) + lc::backward_flops(n, h, v);
  st.counters["peak_extra_MB"] = benchmark::Counter(peak / 1e6);
  // From the same CPU-time total (kIsRate would divide by Google Benchmark's own thread-CPU clock instead).
  st.counters["GFLOP/s"] = total > 0 ? flops * iters / total / 1e9 : 0.0;
  m->seconds = iters ? total / iters : 0;
  m->peak = peak;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions bo;
  if (!bo.parse(argc, argv)) return 2;
  if (bo.help) {
    BenchOptions::print_usage();
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  std::map<int64_t, Measured> linear, naive;  // filled by the benchmark bodies, read for the ratio table
  for (int64_t v : bo.vocabs) {
    const std::string suffix = "/N=" + std::to_string(bo.tokens) + "/H=" + std::to_string(bo.hidden) +
                               "/V=" + std::to_string(v) + "/" + lc::to_string(bo.dtype);
    benchmark::RegisterBenchmark(("linear_ce" + suffix).c_str(),
                                 [&bo, v, &linear](benchmark::State& s) { run_case(s, bo, v, false, &linear[v]); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    if (bo.naive)
      benchmark::RegisterBenchmark(("naive" + suffix).c_str(),
                                   [&bo, v, &naive](benchmark::State& s) { run_case(s, bo, v, true, &naive[v]); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!naive.empty()) {
    std::printf("\n%10s %14s %14s %10s %16s %16s %10s\n", "vocab", "linear_cpu_ms", "naive_cpu_ms", "time_x", "linear_MB",
                "naive_MB", "mem_/");
    for (const auto& [v, l] : linear) {
      auto it = naive.find(v);
      if (it == naive.end() || l.seconds == 0) continue;
      const Measured& nv = it->second;
      std::printf("%10lld %14.1f %14.1f %10.2f %16.2f %16.2f %10.1f\n", static_cast<long long>(v), l.seconds * 1e3,
                  nv.seconds * 1e3, l.seconds / nv.seconds, l.peak / 1e6, nv.peak / 1e6,
                  l.peak ? double(nv.peak) / double(l.peak) : 0.0);
    }
    std::printf("time_x = linear / naive CPU time (above 1 means linear CE is slower); mem_/ = naive / linear peak.\n");
  }
  return 0;
}
