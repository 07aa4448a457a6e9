// GPU benchmark: CUDA linear CE forward + backward, timed with CUDA events; reports achieved TFLOP/s (8NHV per step)
// and the fraction of the dtype's roof (H100 SXM by default, or --roof-tflops). Exits 0 with a message when no
// device is usable.
//   bench_linear_ce_cuda [--tokens=N] [--hidden=H] [--vocab=V] [--dtype=bf16|fp32] [--roof-tflops=R]
//                        [--vocab-tile=T] [--token-tile=T] [google benchmark flags...]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/linear_ce/linear_ce_cuda.h"

namespace lc = lcplan::linear_ce;

namespace {

struct BenchOptions {
  int64_t tokens = 8192;   // Liger's published case: M = 8192, H = 4096, V = 131072
  int64_t hidden = 4096;
  int64_t vocab = 131072;
  lc::DType dtype = lc::DType::BF16;
  double roof_tflops = 0.0;  // 0: the H100 SXM roof of the dtype (default_roof)
  int64_t vocab_tile = 8192;
  int64_t token_tile = 8192;
  bool help = false;

  static void print_usage() {
    std::printf(
        "bench_linear_ce_cuda: CUDA linear cross-entropy, forward + backward\n"
        "  --tokens=N          (default 8192)\n"
        "  --hidden=H          (default 4096)\n"
        "  --vocab=V           (default 131072)\n"
        "  --dtype=bf16|fp32   (default bf16)\n"
        "  --roof-tflops=R     peak dense TFLOP/s of the dtype on this GPU (default: H100 SXM, 989 for bf16,\n"
        "                      67 for fp32)\n"
        "  --vocab-tile=T      (default 8192)\n"
        "  --token-tile=T      (default 8192)\n");
  }

  bool parse(int& argc, char** argv) {
    int out = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto val = [&](const char* key) -> const char* {
        const size_t k = std::strlen(key);
        return a.compare(0, k, key) == 0 ? argv[i] + k : nullptr;
      };
      try {
        if (const char* v = val("--tokens=")) tokens = std::stoll(v);
        else if (const char* v = val("--hidden=")) hidden = std::stoll(v);
        else if (const char* v = val("--vocab=")) vocab = std::stoll(v);
        else if (const char* v = val("--vocab-tile=")) vocab_tile = std::stoll(v);
        else if (const char* v = val("--token-tile=")) token_tile = std::stoll(v);
        else if (const char* v = val("--roof-tflops=")) roof_tflops = std::stod(v);
        else if (const char* v = val("--dtype=")) {
          if (std::strcmp(v, "bf16") == 0) dtype = lc::DType::BF16;
          else if (std::strcmp(v, "fp32") == 0) dtype = lc::DType::F32;
          else throw std::invalid_argument(v);
        } else if (a == "--help" || a == "-h") help = true;
        else argv[out++] = argv[i];
      } catch (const std::exception&) {
        std::fprintf(stderr, "bench_linear_ce_cuda: cannot parse %s\n", argv[i]);
        return false;
      }
    }
    argc = out;
    return roof_tflops >= 0;
  }

  // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989
  // dense; FP32 67 TFLOPS (TF32 Tensor Core 989 with sparsity, 494 dense, is not the roof here: the fp32 path asks
  // cuBLAS for CUBLAS_COMPUTE_32F, which does not use TF32 tensor cores).
  static double default_roof(lc::DType t) { return t == lc::DType::BF16 ? 989.0 : 67.0; }
  double roof() const { return roof_tflops > 0 ? roof_tflops : default_roof(dtype); }
};

// Device buffers for one problem, filled once from host random data.
struct DeviceCase {
  void *hidden = nullptr, *weight = nullptr, *dh = nullptr, *dw = nullptr, *ws = nullptr;
  int64_t* targets = nullptr;
  float *loss = nullptr, *lse = nullptr, *one = nullptr;
  size_t ws_bytes = 0;

  DeviceCase(const BenchOptions& bo, const lc::Options& o) {
    const int64_t n = bo.tokens, h = bo.hidden, v = bo.vocab;
    const size_t es = lc::dtype_bytes(bo.dtype);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto upload = [&](void** dst, int64_t count, float scale) {
      std::vector<char> host(count * es);
      for (int64_t k = 0; k < count; ++k) {
        const float x = nd(rng) * scale;
        if (bo.dtype == lc::DType::BF16) reinterpret_cast<lc::bf16*>(host.data())[k] = lc::float_to_bf16(x);
        else reinterpret_cast<float*>(host.data())[k] = x;
      }
      CUDA_CHECK(cudaMalloc(dst, host.size()));
      CUDA_CHECK(cudaMemcpy(*dst, host.data(), host.size(), cudaMemcpyHostToDevice));
    };
    upload(&hidden, n * h, 1.0f);
    upload(&weight, v * h, 3.0f / std::sqrt(float(h)));
    std::vector<int64_t> tg(n);
    std::uniform_int_distribution<int64_t> tv(0, v - 1);
    for (auto& t : tg) t = tv(rng);
    CUDA_CHECK(cudaMalloc(&targets, n * sizeof(int64_t)));
    CUDA_CHECK(cudaMemcpy(targets, tg.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&dh, n * h * es));
    CUDA_CHECK(cudaMalloc(&dw, v * h * es));
    CUDA_CHECK(cudaMalloc(&loss, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&lse, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
    const float o1 = 1.0f;
    CUDA_CHECK(cudaMemcpy(one, &o1, sizeof(float), cudaMemcpyHostToDevice));
    ws_bytes = lc::cuda::workspace_bytes(lc::Problem{n, h, v}, bo.dtype, o);
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  }
  ~DeviceCase() {
    for (void* p : {hidden, weight, dh, dw, ws, static_cast<void*>(targets), static_cast<void*>(loss),
                    static_cast<void*>(lse), static_cast<void*>(one)})
      if (p) (void)cudaFree(p);  // best effort in a destructor: nothing useful to do on failure
  }
};

void bench_step(benchmark::State& st, const BenchOptions& bo) {
  lc::Options o;
  o.vocab_tile = bo.vocab_tile;
  o.token_tile = bo.token_tile;
  const lc::Problem p{bo.tokens, bo.hidden, bo.vocab};
  DeviceCase dc(bo, o);
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  auto step = [&] {
    lc::cuda::forward(handle, p, bo.dtype, dc.hidden, dc.weight, dc.targets, dc.loss, dc.lse, o, dc.ws, dc.ws_bytes,
                      stream);
    lc::cuda::backward(handle, p, bo.dtype, dc.hidden, dc.weight, dc.targets, dc.lse, dc.one, dc.dh, dc.dw, o, dc.ws,
                       dc.ws_bytes, stream);
  };
  for (int w = 0; w < 2; ++w) step();  // warm-up: cuBLAS heuristics and clocks
  CUDA_CHECK(cudaStreamSynchronize(stream));
  double total_ms = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    step();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    st.SetIterationTime(ms / 1e3);
    total_ms += ms;
    ++iters;
  }
  const double flops = lc::forward_flops(p.tokens, p.hidden, p.vocab) + lc::backward_flops(p.tokens, p.hidden, p.vocab);
  const double tflops = iters ? flops / (total_ms / iters / 1e3) / 1e12 : 0.0;
  st.counters["TFLOP/s"] = tflops;
  st.counters["roof_TFLOP/s"] = bo.roof();
  st.counters["roof_fraction"] = tflops / bo.roof();
  st.counters["workspace_MB"] = dc.ws_bytes / 1e6;
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUBLAS_CHECK(cublasDestroy(handle));
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions bo;
  if (!bo.parse(argc, argv)) {
    BenchOptions::print_usage();
    return 2;
  }
  if (bo.help) {
    BenchOptions::print_usage();
    return 0;
  }
  if (!lcplan::gpu::device_available()) {
    std::printf("bench_linear_ce_cuda: no usable CUDA device here; nothing measured.\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  const std::string name = "linear_ce_cuda/N=" + std::to_string(bo.tokens) + "/H=" + std::to_string(bo.hidden) +
                           "/V=" + std::to_string(bo.vocab) + "/" + lc::to_string(bo.dtype);
  benchmark::RegisterBenchmark(name.c_str(), [&bo](benchmark::State& s) { bench_step(s, bo); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
