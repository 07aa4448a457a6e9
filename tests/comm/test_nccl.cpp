// NCCL backend on real devices; skips cleanly (on every rank) where some rank has no GPU of its own.
#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "kernels/comm/groups.h"
#include "kernels/common/cuda_check.h"
#include "tests/comm/driver.h"
#include "tests/comm/gpu_ranks.h"

namespace lcplan::comm::tests {


TEST(Nccl, AllReduceAndUnevenAllToAllV) {
  if (const std::string why = lcplan::test::gpu_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  lcplan::test::pick_device();
  Comm c = world_nccl();
  const int P = c.size;
  float* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, 7 * sizeof(float)));
  std::vector<float> h(7);
  for (size_t i = 0; i < 7; ++i) h[i] = val(c.rank, i);
  CUDA_CHECK(cudaMemcpy(d, h.data(), 7 * sizeof(float), cudaMemcpyHostToDevice));
  Request r = iall_reduce(c, d, 7, DType::F32, ReduceOp::Sum);
  wait(r);
  CUDA_CHECK(cudaMemcpy(h.data(), d, 7 * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < 7; ++i) {
    float want = 0;
    for (int q = 0; q < P; ++q) want += val(q, i);
    EXPECT_EQ(h[i], want);
  }
  CUDA_CHECK(cudaFree(d));

  std::vector<size_t> sc(P), sd(P), rc(P), rd(P);
  for (int q = 0; q < P; ++q) sc[q] = static_cast<size_t>((c.rank + 2 * q) % 4);
  exchange_counts(c, sc.data(), rc.data(), 1);
  std::exclusive_scan(sc.begin(), sc.end(), sd.begin(), size_t{0});
  std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), size_t{0});
  const size_t ns = sd[P - 1] + sc[P - 1], nr = rd[P - 1] + rc[P - 1];
  std::vector<float> hs(ns), hr(nr);
  for (int q = 0; q < P; ++q)
    for (size_t i = 0; i < sc[q]; ++i) hs[sd[q] + i] = static_cast<float>(c.rank * 100 + q * 10 + i);
  float *ds = nullptr, *dr = nullptr;
  CUDA_CHECK(cudaMalloc(&ds, std::max<size_t>(1, ns) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dr, std::max<size_t>(1, nr) * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(ds, hs.data(), ns * sizeof(float), cudaMemcpyHostToDevice));
  all_to_all_v(c, ds, sc.data(), sd.data(), dr, rc.data(), rd.data(), DType::F32);
  CUDA_CHECK(cudaStreamSynchronize(nullptr));
  CUDA_CHECK(cudaMemcpy(hr.data(), dr, nr * sizeof(float), cudaMemcpyDeviceToHost));
  for (int q = 0; q < P; ++q)
    for (size_t i = 0; i < rc[q]; ++i) EXPECT_EQ(hr[rd[q] + i], static_cast<float>(q * 100 + c.rank * 10 + i));
  CUDA_CHECK(cudaFree(ds));
  CUDA_CHECK(cudaFree(dr));
  free_comm(c);
}

// Messages far larger than NCCL's buffers, both neighbours sending before they receive: on one stream this order
// deadlocks; sendrecv (one group) and the pipeline links (a stream per outgoing link, receives on the compute stream)
// complete it, and every element arrives.
TEST(Nccl, SendBeforeReceiveCompletesOnLinksAndSendrecv) {
  if (const std::string why = lcplan::test::gpu_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  lcplan::test::pick_device();
  cudaStream_t compute = nullptr, fwd = nullptr, bwd = nullptr;
  for (cudaStream_t* st : {&compute, &fwd, &bwd}) CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  Comm c = world_nccl(compute);
  const int P = c.size;
  const size_t n = size_t(16) << 20;  // 64 MiB of floats per message
  std::vector<float> h(n);
  float *out = nullptr, *in_a = nullptr, *in_b = nullptr;
  for (float** p : {&out, &in_a, &in_b}) CUDA_CHECK(cudaMalloc(p, n * sizeof(float)));
  for (size_t i = 0; i < n; i += 4099) h[i] = val(c.rank, i);
  CUDA_CHECK(cudaMemcpy(out, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  auto check = [&](const float* d, int from, const char* what) {
    std::vector<float> got(n);
    CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], val(from, i)) << what << " element " << i;
  };
  if (P >= 2) {
    const int peer = c.rank ^ 1;
    if (peer < P) {
      Comm pair = split(c, {std::min(c.rank, peer), std::max(c.rank, peer)});
      sendrecv(pair, out, in_a, n, DType::F32, 1 - pair.rank);
      CUDA_CHECK(cudaStreamSynchronize(compute));
      check(in_a, peer, "sendrecv");
      free_comm(pair);
    } else {
      Comm alone = split(c, {c.rank});
      free_comm(alone);
    }
    PipeLinks l = make_pipe_links(c, compute, fwd, bwd);
    Request a = isend(l.fwd_out, out, n, DType::F32, link_peer(l.fwd_out));
    Request b = isend(l.bwd_out, out, n, DType::F32, link_peer(l.bwd_out));
    recv(l.fwd_in, in_a, n, DType::F32, link_peer(l.fwd_in));
    recv(l.bwd_in, in_b, n, DType::F32, link_peer(l.bwd_in));
    CUDA_CHECK(cudaStreamSynchronize(compute));
    wait(a);
    wait(b);
    check(in_a, (c.rank + P - 1) % P, "activations link");
    check(in_b, (c.rank + 1) % P, "gradients link");
    free_pipe_links(l);
  }
  for (float* p : {out, in_a, in_b}) CUDA_CHECK(cudaFree(p));
  free_comm(c);
  for (cudaStream_t st : {compute, fwd, bwd}) CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace lcplan::comm::tests
