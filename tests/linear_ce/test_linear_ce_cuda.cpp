// CUDA linear CE against the CPU implementation and the fp64 reference; skips itself when no device is usable.
#include <gtest/gtest.h>

#include "kernels/common/cuda_check.h"
#include "kernels/linear_ce/linear_ce_cuda.h"
#include "tests/linear_ce/reference.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::make_data;

// Device copies of one Data, the run's outputs decoded back to fp32 on the host.
test::Outputs run_cuda(const Data& d, const Options& o) {
  const size_t es = dtype_bytes(d.dtype);
  const Problem p = d.problem();
  auto dev = [](const void* src, size_t bytes) {
    void* x = nullptr;
    CUDA_CHECK(cudaMalloc(&x, std::max<size_t>(bytes, 1)));
    if (bytes) CUDA_CHECK(cudaMemcpy(x, src, bytes, cudaMemcpyHostToDevice));
    return x;
  };
  const std::vector<float> one{1.0f};
  const bool none = o.reduction == Reduction::None;
  void* hidden = dev(d.hidden(), d.n * d.h * es);
  void* weight = dev(d.weight(), d.v * d.h * es);
  auto* targets = static_cast<int64_t*>(dev(d.targets.data(), d.n * sizeof(int64_t)));
  auto* grad = static_cast<float*>(none ? dev(d.grad.data(), d.n * sizeof(float)) : dev(one.data(), sizeof(float)));
  auto* loss = static_cast<float*>(dev(nullptr, (none ? d.n : 1) * sizeof(float)));
  auto* lse = static_cast<float*>(dev(nullptr, d.n * sizeof(float)));
  void* dh = dev(nullptr, d.n * d.h * es);
  void* dw = dev(nullptr, d.v * d.h * es);
  const size_t ws_bytes = cuda::workspace_bytes(p, d.dtype, o);
  void* ws = dev(nullptr, ws_bytes);
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cuda::forward(handle, p, d.dtype, hidden, weight, targets, loss, lse, o, ws, ws_bytes, stream);
  cuda::backward(handle, p, d.dtype, hidden, weight, targets, lse, grad, dh, dw, o, ws, ws_bytes, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  test::Outputs out;
  out.loss.resize(none ? d.n : 1);
  out.lse.resize(d.n);
  CUDA_CHECK(cudaMemcpy(out.loss.data(), loss, out.loss.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out.lse.data(), lse, out.lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  auto fetch = [&](const void* src, int64_t count) {
    std::vector<char> raw(count * es);
    CUDA_CHECK(cudaMemcpy(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost));
    std::vector<float> v;
    for (int64_t k = 0; k < count; ++k)
      v.push_back(d.dtype == DType::BF16 ? bf16_to_float(reinterpret_cast<bf16*>(raw.data())[k])
                                         : reinterpret_cast<float*>(raw.data())[k]);
    return v;
  };
  out.dh = fetch(dh, d.n * d.h);
  out.dw = fetch(dw, d.v * d.h);
  CUBLAS_CHECK(cublasDestroy(handle));
  CUDA_CHECK(cudaStreamDestroy(stream));
  for (void* x : {hidden, weight, static_cast<void*>(targets), static_cast<void*>(grad), static_cast<void*>(loss),
                  static_cast<void*>(lse), dh, dw, ws})
    CUDA_CHECK(cudaFree(x));
  return out;
}

std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

class LinearCeCuda : public ::testing::TestWithParam<Reduction> {
 protected:
  void SetUp() override {
    if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  }
};

TEST_P(LinearCeCuda, Fp32MatchesCpu) {
  const Data d = make_data(252, 507, 1231, DType::F32, 41);
  Options o;
  o.reduction = GetParam();
  o.vocab_tile = 256;
  o.token_tile = 100;
  const auto cpu = test::run_cpu(d, o);
  const auto gpu = run_cuda(d, o);
  // Summation order differs between cuBLAS and Eigen; both are fp32 with fp32 accumulation.
  test::expect_rel("loss", gpu.loss, widen(cpu.loss), 1e-5);
  test::expect_rel("lse", gpu.lse, widen(cpu.lse), 1e-5);
  test::expect_rel("d_hidden", gpu.dh, widen(cpu.dh), 1e-4);
  test::expect_rel("d_weight", gpu.dw, widen(cpu.dw), 1e-4);
}

TEST_P(LinearCeCuda, Bf16NoWorseThanNaiveBf16) {
  const Data d = make_data(252, 507, 1231, DType::BF16, 42);
  Options o;
  o.reduction = GetParam();
  o.vocab_tile = 256;
  o.token_tile = 100;
  const auto ref = test::reference(d, o);
  const auto naive = test::run_naive(d, o);
  const auto gpu = run_cuda(d, o);
  test::expect_no_worse("loss", gpu.loss, naive.loss, ref.loss, 1e-2);
  test::expect_no_worse("d_hidden", gpu.dh, naive.dh, ref.dh, 1e-2);
  test::expect_no_worse("d_weight", gpu.dw, naive.dw, ref.dw, 1e-2);
}

TEST_P(LinearCeCuda, SoftcapZLossAndIgnoredMatchCpu) {
  const Data d = make_data(97, 64, 333, DType::F32, 43, 0.3);
  Options o;
  o.reduction = GetParam();
  o.softcap = 10.0f;
  o.z_loss = 1e-3f;
  o.vocab_tile = 128;
  o.token_tile = 40;
  const auto cpu = test::run_cpu(d, o);
  const auto gpu = run_cuda(d, o);
  test::expect_rel("loss", gpu.loss, widen(cpu.loss), 1e-5);
  test::expect_rel("d_hidden", gpu.dh, widen(cpu.dh), 1e-4);
  test::expect_rel("d_weight", gpu.dw, widen(cpu.dw), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(All, LinearCeCuda, ::testing::Values(Reduction::None, Reduction::Mean, Reduction::Sum),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(LinearCeCudaInput, BadTargetThrowsAfterForward) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  Data d = make_data(8, 16, 32, DType::F32, 44);
  d.targets[3] = 32;
  Options o;
  EXPECT_THROW(run_cuda(d, o), std::invalid_argument);
}

TEST(LinearCeCudaInput, WorkspaceSizeIsCheckedWithoutADevice) {
  // Host-side validation runs before any CUDA call, so it is testable here.
  const Problem p{4, 8, 16};
  Options o;
  EXPECT_GT(cuda::workspace_bytes(p, DType::BF16, o), 0u);
  char small[16];
  EXPECT_THROW(cuda::forward(nullptr, p, DType::F32, small, small, reinterpret_cast<int64_t*>(small),
                             reinterpret_cast<float*>(small), reinterpret_cast<float*>(small), o, small, sizeof small,
                             nullptr),
               std::invalid_argument);
  o.vocab_tile = 0;
  EXPECT_THROW(cuda::workspace_bytes(p, DType::F32, o), std::invalid_argument);
}

}  // namespace
}  // namespace lcplan::linear_ce
