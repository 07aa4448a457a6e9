// NCCL backend on real devices; skips cleanly (on every rank) where no GPU can be used.
#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "tests/comm/driver.h"

namespace lcplan::comm::tests {

namespace {
// Every rank must agree on skipping, or the ranks that go on would hang in NCCL init.
bool all_have_device() {
  int ok = lcplan::gpu::device_available() ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return ok == 1;
}
void pick_device() {
  int n = 0, rank = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  CUDA_CHECK(cudaSetDevice(rank % n));
}
}  // namespace

TEST(Nccl, AllReduceAndUnevenAllToAllV) {
  if (!all_have_device()) GTEST_SKIP() << "no usable CUDA device";
  pick_device();
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

}  // namespace lcplan::comm::tests
