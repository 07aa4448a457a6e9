// CUDA MoE kernels against the CPU math (moe_math.h); skips cleanly where no GPU can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_kernels_cuda.h"

namespace lcplan::moe {
namespace {

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(const std::vector<T>& h) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, h.size()) * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t n) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { CUDA_LOG(cudaFree(p)); }
  std::vector<T> get(size_t n) const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

TEST(MoeCuda, RoutePermuteSwigluGemmUnpermuteMatchCpu) {
  if (!lcplan::gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  RouterParams p;
  p.kind = Router::SigmoidGroupLimited;
  p.experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  const int T = 13, E = 8, K = 2, H = 16, F = 8;
  std::vector<float> logits(T * E), bias(E, 0.f), x(T * H);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7f * i);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.3f * i);
  bias[3] = -5.f;  // expert 3 receives nothing

  std::vector<float> scores(T * E), w(T * K);
  std::vector<int> idx(T * K);
  for (int t = 0; t < T; ++t) route_token(p, &logits[t * E], bias.data(), &scores[t * E], &idx[t * K], &w[t * K]);
  std::vector<int> offsets(E + 1), rows(T * K);
  expert_major_rows(idx.data(), T * K, E, offsets.data(), rows.data());

  Dev<float> dl(logits), db(bias), ds(T * E), dw(T * K), dx(x);
  Dev<int> di(T * K), doff(E + 1), drows(T * K);
  gpu::launch_route(dl.p, db.p, p, T, ds.p, di.p, dw.p, nullptr);
  const size_t ws_bytes = gpu::expert_major_rows_workspace(T * K, E);
  Dev<char> ws(ws_bytes);
  gpu::launch_expert_major_rows(di.p, T * K, E, doff.p, drows.p, ws.p, ws_bytes, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(di.get(T * K), idx);
  EXPECT_EQ(drows.get(T * K), rows);
  const auto gw = dw.get(T * K);
  for (int i = 0; i < T * K; ++i) EXPECT_NEAR(gw[i], w[i], 1e-6);

  // Permute -> per-expert fc1 -> swiglu -> unpermute of the activations' first H columns (shape check of the chain).
  Dev<float> dxp(size_t(T) * K * H), dh1(size_t(T) * K * 2 * F), dact(size_t(T) * K * F);
  std::vector<float> w1(size_t(E) * H * 2 * F);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = std::sin(0.11f * i) * 0.25f;
  Dev<float> dw1(w1);
  gpu::launch_permute<float>(dx.p, drows.p, T, K, H, dxp.p, nullptr);
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  std::vector<int64_t> off64(offsets.begin(), offsets.end());
  gpu::grouped_gemm(h, false, dxp.p, dw1.p, dh1.p, off64.data(), E, H, 2 * F, CUDA_R_32F, CUDA_R_32F, nullptr);
  gpu::launch_swiglu<float>(dh1.p, T * K, F, dact.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUBLAS_CHECK(cublasDestroy(h));
  const auto act = dact.get(size_t(T) * K * F);
  for (int s = 0; s < T * K; ++s) {
    const int e = idx[s], r = rows[s], t = s / K;
    for (int j = 0; j < F; ++j) {
      float g = 0, u = 0;
      for (int q = 0; q < H; ++q) {
        g += x[t * H + q] * w1[(size_t(e) * H + q) * 2 * F + j];
        u += x[t * H + q] * w1[(size_t(e) * H + q) * 2 * F + F + j];
      }
      EXPECT_NEAR(act[size_t(r) * F + j], swiglu(g, u), 1e-4);
    }
  }
  // Unpermute the permuted inputs themselves: out[t] = sum_k w * x[t] = x[t] * sum_k w (= x[t] when normalised).
  Dev<float> dout(size_t(T) * H);
  gpu::launch_unpermute<float>(dxp.p, drows.p, dw.p, T, K, H, nullptr, nullptr, dout.p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = dout.get(size_t(T) * H);
  for (int i = 0; i < T * H; ++i) EXPECT_NEAR(out[i], x[i], 1e-5);
}

TEST(MoeCuda, ParallelPermutationIsTheStableSequentialOne) {
  if (!lcplan::gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  // Many tiles, experts split across tiles, two experts that receive nothing, and the empty case.
  for (int n : {0, 1, 127, 128, 129, 5003, 70000}) {
    const int E = 16;
    std::vector<int> expert(n);
    for (int i = 0; i < n; ++i) {
      const int e = int((uint32_t(i) * 2654435761u) >> 7) % E;
      expert[i] = e == 5 || e == 11 ? (e + 1) % E : e;
    }
    std::vector<int> off(E + 1), rows(n);
    expert_major_rows(expert.data(), n, E, off.data(), rows.data());
    const size_t ws_bytes = gpu::expert_major_rows_workspace(n, E);
    Dev<int> de(expert), doff(E + 1), drows(n);
    Dev<char> ws(ws_bytes);
    gpu::launch_expert_major_rows(de.p, n, E, doff.p, drows.p, ws.p, ws_bytes, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(doff.get(E + 1), off) << n;
    EXPECT_EQ(drows.get(n), rows) << n;
  }
}

TEST(MoeCuda, RowMajorGemmWrapperHandlesTransposesAndBf16) {
  if (!lcplan::gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  // C[m x n] = op(A) op(B) for all four transpose combinations, fp32 (tight) and bf16 inputs (loose).
  const int m = 5, n = 7, k = 3;
  std::vector<float> A(m * k), B(k * n);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.9f * i);
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.4f * i);
  std::vector<float> want(m * n, 0.f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int q = 0; q < k; ++q) want[i * n + j] += A[i * k + q] * B[q * n + j];
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> a = A, b = B;  // store the transposes when asked to
      if (ta)
        for (int i = 0; i < m; ++i)
          for (int q = 0; q < k; ++q) a[q * m + i] = A[i * k + q];
      if (tb)
        for (int q = 0; q < k; ++q)
          for (int j = 0; j < n; ++j) b[j * k + q] = B[q * n + j];
      Dev<float> da(a), db(b), dc(size_t(m) * n);
      gpu::gemm(h, ta, tb, m, n, k, da.p, db.p, dc.p, CUDA_R_32F, CUDA_R_32F, 1.f, 0.f, true, nullptr);
      Dev<gpu::bf16> ha(size_t(m) * k), hb(size_t(k) * n);
      gpu::launch_cast<gpu::bf16>(da.p, int64_t(m) * k, ha.p, nullptr);
      gpu::launch_cast<gpu::bf16>(db.p, int64_t(k) * n, hb.p, nullptr);
      Dev<float> dc16(size_t(m) * n);
      gpu::gemm(h, ta, tb, m, n, k, ha.p, hb.p, dc16.p, CUDA_R_16BF, CUDA_R_32F, 1.f, 0.f, false, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto c = dc.get(size_t(m) * n), c16 = dc16.get(size_t(m) * n);
      for (int i = 0; i < m * n; ++i) {
        EXPECT_NEAR(c[i], want[i], 1e-5) << ta << tb << " " << i;
        EXPECT_NEAR(c16[i], want[i], 3e-2) << ta << tb << " bf16 " << i;
      }
    }
  CUBLAS_CHECK(cublasDestroy(h));
}

}  // namespace
}  // namespace lcplan::moe
