// CUDA linear CE against the CPU implementation and the fp64 reference, its edge cases, and the vocabulary-parallel
// combine through its device hook (threads stand in for ranks). Skips itself when no device is usable; the host-side
// argument checks run everywhere.
#include <gtest/gtest.h>

#include <thread>

#include "tests/linear_ce/cuda_harness.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::expect_rel;
using test::make_data;
using test::odd_tiles;
using test::run_cuda;
using test::widen;

void expect_matches_cpu(const Data& d, const Options& o, double grad_rtol = 1e-4) {
  const auto cpu = test::run_cpu(d, o);
  const auto gpu = run_cuda(d, o);
  // Summation order differs between cuBLAS and Eigen; both are fp32 with fp32 accumulation.
  expect_rel("loss", gpu.loss, widen(cpu.loss), 1e-5);
  expect_rel("lse", gpu.lse, widen(cpu.lse), 1e-5);
  expect_rel("d_hidden", gpu.dh, widen(cpu.dh), grad_rtol);
  expect_rel("d_weight", gpu.dw, widen(cpu.dw), grad_rtol);
}

bool no_device() { return !gpu::device_available(); }

class LinearCeCuda : public ::testing::TestWithParam<Reduction> {
 protected:
  void SetUp() override {
    if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  }
};

TEST_P(LinearCeCuda, Fp32MatchesCpu) {
  expect_matches_cpu(make_data(252, 507, 1231, DType::F32, 41), odd_tiles(GetParam()));
}

TEST_P(LinearCeCuda, Bf16NoWorseThanNaiveBf16AndCloseToFp64) {
  const Data d = make_data(252, 507, 1231, DType::BF16, 42);
  const Options o = odd_tiles(GetParam());
  // Same rule as the CPU path, scale check included: an all-zero d_hidden would pass the naive bound alone.
  test::expect_bf16_close(run_cuda(d, o), test::run_naive(d, o), test::reference(d, o));
}

TEST_P(LinearCeCuda, SoftcapZLossAndIgnoredMatchCpu) {
  Options o;
  o.reduction = GetParam();
  o.softcap = 10.0f;
  o.z_loss = 1e-3f;
  o.vocab_tile = 128;
  o.token_tile = 40;
  expect_matches_cpu(make_data(97, 64, 333, DType::F32, 43, 0.3), o);
}

TEST_P(LinearCeCuda, AllTargetsIgnoredGivesZeroLossAndGradients) {
  const Data d = make_data(33, 40, 257, DType::F32, 45, /*ignore_frac=*/1.1);
  const Options o = odd_tiles(GetParam());
  const auto gpu = run_cuda(d, o);
  for (float x : gpu.loss) EXPECT_EQ(x, 0.0f);
  for (float x : gpu.lse) EXPECT_TRUE(std::isfinite(x));
  for (float x : gpu.dh) ASSERT_EQ(x, 0.0f);
  for (float x : gpu.dw) ASSERT_EQ(x, 0.0f);
  expect_rel("lse", gpu.lse, test::reference(d, o).lse, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(All, LinearCeCuda, ::testing::Values(Reduction::None, Reduction::Mean, Reduction::Sum),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(LinearCeCudaEdge, OneToken) {
  if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  const Options o = odd_tiles(Reduction::Mean);
  expect_matches_cpu(make_data(1, 77, 301, DType::F32, 46, 0.0), o);
  const Data b = make_data(1, 77, 301, DType::BF16, 46, 0.0);
  test::expect_bf16_close(run_cuda(b, o), test::run_naive(b, o), test::reference(b, o));
}

TEST(LinearCeCudaEdge, VocabSmallerThanOneTile) {
  if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  Options o;
  o.vocab_tile = 2048;
  o.reduction = Reduction::Mean;
  expect_matches_cpu(make_data(50, 33, 37, DType::F32, 47), o);
}

TEST(LinearCeCudaEdge, ZeroTokensIsANoOp) {
  if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  for (DType t : {DType::F32, DType::BF16}) {
    const auto gpu = run_cuda(make_data(0, 8, 16, t, 48), Options{});
    ASSERT_EQ(gpu.loss.size(), 1u);
    EXPECT_EQ(gpu.loss[0], 0.0f);
    for (float x : gpu.dw) EXPECT_EQ(x, 0.0f);
  }
}

TEST(LinearCeCudaInput, BadTargetThrowsInForwardAndBackward) {
  if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  Data d = make_data(8, 16, 32, DType::F32, 44);
  d.targets[3] = 32;
  const std::string msg = test::error_of([&] { run_cuda(d, Options{}); });
  EXPECT_NE(msg.find("1 targets are outside [0, 32)"), std::string::npos) << msg;
  // The backward checks on its own: the targets it gets need not be the ones the forward saw.
  const Options o;
  const test::DeviceProblem x(d, o, d.problem(), d.weight());
  CUDA_CHECK(cudaMemset(x.lse.as(), 0, d.n * sizeof(float)));
  EXPECT_THROW(cuda::backward(x.ctx.handle, d.problem(), DType::F32, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(),
                              x.lse.as<float>(), x.grad.as<float>(), x.dh.as(), x.dw.as(), o, x.ws.as(), x.ws_bytes,
                              x.ctx.stream),
               std::invalid_argument);
}

// Ranks as threads on one device, each with its own stream; the hook stages through the host to the thread reduce.
TEST(LinearCeCudaVocabParallel, ShardsCombinedThroughDeviceHookMatchSingleRank) {
  if (no_device()) GTEST_SKIP() << "no usable CUDA device";
  for (DType t : {DType::F32, DType::BF16}) {
    const Data d = make_data(70, 45, 1231, t, 49);
    Options o = odd_tiles(Reduction::Mean);
    o.softcap = 20.0f;
    o.z_loss = 1e-4f;
    const auto whole = run_cuda(d, o);
    const int ranks = 4;
    const int64_t shard = (d.v + ranks - 1) / ranks;  // uneven last shard
    test::ThreadAllReduce ar(ranks);
    std::vector<test::Outputs> per(ranks);
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> th;
    for (int r = 0; r < ranks; ++r) {
      th.emplace_back([&, r] {
        try {
          const int64_t start = r * shard, size = std::min(shard, d.v - start);
          const CrossRankAllReduce host = ar.hook(r);
          const cuda::DeviceAllReduce staged = [&host](float* buf, size_t n, CrossRankOp op, cudaStream_t s) {
            std::vector<float> h(n);
            CUDA_CHECK(cudaMemcpyAsync(h.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            host(h.data(), n, op);
            CUDA_CHECK(cudaMemcpyAsync(buf, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
          };
          const void* w = static_cast<const char*>(d.weight()) + start * d.h * dtype_bytes(t);
          per[r] = run_cuda(d, o, Problem{d.n, d.h, size, start, d.v}, w, staged);
        } catch (const std::exception& e) {
          errors[r] = e.what();  // a throwing thread would otherwise terminate the process
        }
      });
    }
    for (auto& x : th) x.join();
    for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    const double tol = t == DType::F32 ? 1e-5 : 8e-3;  // bf16: one output rounding may land either side
    std::vector<float> dw_cat;
    for (int r = 0; r < ranks; ++r) {
      expect_rel("loss", per[r].loss, widen(whole.loss), 1e-5);
      expect_rel("lse", per[r].lse, widen(whole.lse), 1e-5);
      expect_rel("d_hidden", per[r].dh, widen(whole.dh), tol);
      dw_cat.insert(dw_cat.end(), per[r].dw.begin(), per[r].dw.end());
    }
    expect_rel("d_weight", dw_cat, widen(whole.dw), tol);
  }
}

TEST(LinearCeCudaInput, HostSideChecksRunWithoutADevice) {
  // Argument validation runs before any CUDA call, so it is testable on a machine without a GPU.
  const Problem p{4, 8, 16};
  Options o;
  EXPECT_GT(cuda::workspace_bytes(p, DType::BF16, o), 0u);
  char small[16];
  auto* f = reinterpret_cast<float*>(small);
  auto* tg = reinterpret_cast<int64_t*>(small);
  const std::string ws_msg = test::error_of(
      [&] { cuda::forward(nullptr, p, DType::F32, small, small, tg, f, f, o, small, sizeof small, nullptr); });
  EXPECT_NE(ws_msg.find("workspace is 16 bytes"), std::string::npos) << ws_msg;
  // A shard without a cross-rank all-reduce would silently be a partial loss: both launchers refuse it.
  const Problem shard{4, 8, 16, 16, 32};
  const size_t need = cuda::workspace_bytes(shard, DType::F32, o);
  std::vector<char> host_ws(need);
  const std::string fwd_msg = test::error_of([&] {
    cuda::forward(nullptr, shard, DType::F32, small, small, tg, f, f, o, host_ws.data(), need, nullptr);
  });
  EXPECT_NE(fwd_msg.find("no cross-rank all-reduce"), std::string::npos) << fwd_msg;
  const std::string bwd_msg = test::error_of([&] {
    cuda::backward(nullptr, shard, DType::F32, small, small, tg, f, f, small, small, o, host_ws.data(), need, nullptr);
  });
  EXPECT_NE(bwd_msg.find("vocab_start = 16 and vocab_total = 32"), std::string::npos) << bwd_msg;
  o.vocab_tile = 0;
  EXPECT_THROW(cuda::workspace_bytes(p, DType::F32, o), std::invalid_argument);
}

}  // namespace
}  // namespace lcplan::linear_ce
