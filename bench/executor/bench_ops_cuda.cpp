// GPU benchmark of the executor's device ops (executor/ops_cuda.h), timed with CUDA events (manual time): RMSNorm
// forward and backward, SwiGLU forward, Adam, and the fp32 GEMM against a bf16 weight. Each reports the bytes it
// must move (bytes_per_second) so it can be read against the device's HBM bandwidth, and the GEMM its FLOP rate.
// Exits 0 with a message when no device is usable. Nothing here has been measured yet (no GPU in development).
//   bench_ops_cuda [--rows=N] [--hidden=H] [google benchmark flags...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <cublas_v2.h>

#include "executor/device_buf_cuda.h"
#include "executor/ops_cuda.h"

namespace cu = lcplan::exec::cuda;
using lcplan::bf16;
using lcplan::exec::Category;
using lcplan::exec::Tracker;

namespace {

struct BenchOptions {
  int64_t rows = 16384;   // tokens of one microbatch on one rank (128K context over CP 8)
  int64_t hidden = 2048;  // Qwen3.5-35B-A3B hidden size (models/zoo/qwen3.5-35b-a3b.json)

  static void print_usage() {
    std::printf(
        "bench_ops_cuda: the executor's device ops\n"
        "  --rows=N    token rows (default 16384)\n"
        "  --hidden=H  row width (default 2048)\n");
  }
  // Consumes its own flags; false (after printing why) on a bad value.
  bool parse(int& argc, char** argv) {
    int out = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      try {
        if (a.rfind("--rows=", 0) == 0) rows = std::stoll(a.substr(7));
        else if (a.rfind("--hidden=", 0) == 0) hidden = std::stoll(a.substr(9));
        else if (a == "--help") {
          print_usage();
          return false;
        } else argv[out++] = argv[i];
      } catch (const std::exception&) {
        std::fprintf(stderr, "bench_ops_cuda: %s is not a whole number (valid: --rows=N, --hidden=H)\n", a.c_str());
        return false;
      }
    }
    argc = out;
    if (rows <= 0 || hidden <= 0) {
      std::fprintf(stderr, "bench_ops_cuda: rows = %lld and hidden = %lld must be at least 1\n", (long long)rows,
                   (long long)hidden);
      return false;
    }
    return true;
  }
};

BenchOptions g_opt;

// Times `body` on one stream with an event pair per iteration.
template <class F>
void timed(benchmark::State& st, cudaStream_t s, F body) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  body();  // warm-up
  for (auto _ : st) {
    CUDA_CHECK(cudaEventRecord(a, s));
    body();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    st.SetIterationTime(double(ms) / 1e3);
  }
  CUDA_LOG(cudaEventDestroy(a));
  CUDA_LOG(cudaEventDestroy(b));
}

void BM_RmsNorm(benchmark::State& st) {
  Tracker t;
  const int64_t R = g_opt.rows, H = g_opt.hidden;
  cu::DeviceBuf<float> x(t, Category::Workspace, size_t(R * H)), y(t, Category::Workspace, size_t(R * H));
  cu::DeviceBuf<bf16> w(t, Category::Params, size_t(H));
  timed(st, nullptr, [&] { cu::rmsnorm(x.data(), w.data(), y.data(), R, H, nullptr); });
  st.SetBytesProcessed(int64_t(st.iterations()) * R * H * 8);  // read x, write y (fp32)
}

void BM_RmsNormBackward(benchmark::State& st) {
  Tracker t;
  const int64_t R = g_opt.rows, H = g_opt.hidden;
  cu::DeviceBuf<float> x(t, Category::Workspace, size_t(R * H)), dy(t, Category::Workspace, size_t(R * H)),
      dx(t, Category::Workspace, size_t(R * H)), dw(t, Category::Grads, size_t(H));
  cu::DeviceBuf<bf16> w(t, Category::Params, size_t(H));
  cu::DeviceBuf<double> ws(t, Category::Workspace, cu::norm_bwd_workspace_bytes(R) / sizeof(double));
  timed(st, nullptr, [&] {
    cu::rmsnorm_bwd(x.data(), w.data(), dy.data(), dx.data(), dw.data(), R, H, false, ws.data(), ws.bytes(), nullptr);
  });
  st.SetBytesProcessed(int64_t(st.iterations()) * R * H * 4 * 7);  // stats: x, dy; dw: x, dy; dx: x, dy, write dx
}

void BM_Swiglu(benchmark::State& st) {
  Tracker t;
  const int64_t R = g_opt.rows, F = g_opt.hidden;
  cu::DeviceBuf<float> h1(t, Category::Workspace, size_t(R * 2 * F)), act(t, Category::Workspace, size_t(R * F));
  timed(st, nullptr, [&] { cu::swiglu_fwd(h1.data(), act.data(), R, F, nullptr); });
  st.SetBytesProcessed(int64_t(st.iterations()) * R * F * 12);  // read gate and up, write act
}

void BM_Adam(benchmark::State& st) {
  Tracker t;
  const size_t n = size_t(g_opt.rows * g_opt.hidden);
  cu::DeviceBuf<float> g(t, Category::Grads, n), m(t, Category::Optimizer, n), v(t, Category::Optimizer, n),
      master(t, Category::Optimizer, n);
  cu::DeviceBuf<bf16> p(t, Category::Params, n);
  const auto a = lcplan::exec::math::adam_scalars(1e-4, 0.9, 0.95, 1e-8, 1);
  timed(st, nullptr, [&] { cu::adam(g.data(), m.data(), v.data(), master.data(), p.data(), n, a, nullptr); });
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n) * (4 * 4 + 3 * 4 + 2));  // read 4 fp32, write 3 + bf16
}

void BM_Matmul(benchmark::State& st) {
  Tracker t;
  const int64_t R = g_opt.rows, K = g_opt.hidden, N = g_opt.hidden;
  cu::DeviceBuf<float> x(t, Category::Workspace, size_t(R * K)), y(t, Category::Workspace, size_t(R * N));
  cu::DeviceBuf<bf16> W(t, Category::Params, size_t(K * N));
  cu::DeviceBuf<float> ws(t, Category::Workspace, cu::matmul_workspace_bytes(K, N) / sizeof(float));
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  timed(st, nullptr, [&] { cu::matmul(h, x.data(), W.data(), y.data(), R, K, N, ws.data(), ws.bytes(), nullptr); });
  st.counters["TFLOP/s"] = benchmark::Counter(double(st.iterations()) * 2.0 * R * K * N / 1e12,
                                              benchmark::Counter::kIsRate);
  CUBLAS_LOG(cublasDestroy(h));
}

}  // namespace

int main(int argc, char** argv) {
  if (!g_opt.parse(argc, argv)) return 2;
  if (!lcplan::gpu::device_available()) {
    std::printf("bench_ops_cuda: no usable CUDA device; nothing measured\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  for (auto* b : {benchmark::RegisterBenchmark("BM_RmsNorm", BM_RmsNorm),
                  benchmark::RegisterBenchmark("BM_RmsNormBackward", BM_RmsNormBackward),
                  benchmark::RegisterBenchmark("BM_Swiglu", BM_Swiglu), benchmark::RegisterBenchmark("BM_Adam", BM_Adam),
                  benchmark::RegisterBenchmark("BM_Matmul", BM_Matmul)})
    b->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
