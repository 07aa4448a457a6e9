// Vocabulary-parallel CUDA linear CE through lcplan::comm under mpirun -np 2: the MPI communicator (device buffers
// staged through the host) always, NCCL as well when every rank has a device of its own. Each rank compares with
// the single-rank CUDA result it computes itself. Skips without a device; main() is mpi_main.cpp.
#include <gtest/gtest.h>

#include "kernels/linear_ce/linear_ce_vocab_parallel.h"
#include "kernels/linear_ce/linear_ce_vocab_parallel_cuda.h"
#include "tests/linear_ce/cuda_harness.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::expect_rel;
using test::make_data;
using test::widen;

// Selects this rank's device; false (the test skips) when there is none. The answer is the same on every rank.
bool pick_device(const comm::Comm& c, int* devices) {
  if (!gpu::device_available()) return false;
  CUDA_CHECK(cudaGetDeviceCount(devices));
  CUDA_CHECK(cudaSetDevice(c.rank % *devices));
  return true;
}

void expect_matches_single_rank(const comm::Comm& c, DType t) {
  const Data d = make_data(96, 130, 701, t, 51);
  Options o;
  o.vocab_tile = 128;
  o.token_tile = 40;
  o.softcap = 15.0f;
  o.z_loss = 1e-4f;
  const auto whole = test::run_cuda(d, o);
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const Problem p{d.n, d.h, s.size, s.start, d.v};
  const test::DeviceProblem x(d, o, p, static_cast<const char*>(d.weight()) + s.start * d.h * dtype_bytes(t));
  cuda::forward_vocab_parallel(c, x.ctx.handle, p, t, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(),
                               x.loss.as<float>(), x.lse.as<float>(), o, x.ws.as(), x.ws_bytes, x.ctx.stream);
  cuda::backward_vocab_parallel(c, x.ctx.handle, p, t, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(),
                                x.lse.as<float>(), x.grad.as<float>(), x.dh.as(), x.dw.as(), o, x.ws.as(), x.ws_bytes,
                                x.ctx.stream);
  const auto mine = x.outputs();
  const double tol = t == DType::F32 ? 1e-5 : 8e-3;  // bf16: one output rounding may land either side
  expect_rel("loss", mine.loss, widen(whole.loss), 1e-5);
  expect_rel("lse", mine.lse, widen(whole.lse), 1e-5);
  expect_rel("d_hidden", mine.dh, widen(whole.dh), tol);
  const std::vector<float> rows(whole.dw.begin() + s.start * d.h, whole.dw.begin() + (s.start + s.size) * d.h);
  expect_rel("d_weight shard", mine.dw, widen(rows), tol);
}

TEST(LinearCeCudaVocabParallel, MpiStagedMatchesSingleRank) {
  comm::Comm c = comm::world_mpi();
  int devices = 0;
  if (!pick_device(c, &devices)) GTEST_SKIP() << "no usable CUDA device";
  for (DType t : {DType::F32, DType::BF16}) expect_matches_single_rank(c, t);
  comm::free_comm(c);
}

TEST(LinearCeCudaVocabParallel, NcclMatchesSingleRank) {
  comm::Comm m = comm::world_mpi();
  int devices = 0;
  const bool have = pick_device(m, &devices);
  const int size = m.size;
  comm::free_comm(m);
  if (!have) GTEST_SKIP() << "no usable CUDA device";
  if (!comm::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  if (devices < size) GTEST_SKIP() << "NCCL needs one device per rank: " << devices << " for " << size << " ranks";
  // The communicator runs on its own stream, so the launcher's event fencing between the two streams is exercised.
  cudaStream_t comm_stream;
  CUDA_CHECK(cudaStreamCreate(&comm_stream));
  comm::Comm c = comm::world_nccl(comm_stream);
  for (DType t : {DType::F32, DType::BF16}) expect_matches_single_rank(c, t);
  comm::free_comm(c);
  CUDA_CHECK(cudaStreamDestroy(comm_stream));
}

TEST(LinearCeCudaVocabParallel, MismatchedOptionsFailOnEveryRank) {
  comm::Comm c = comm::world_mpi();
  int devices = 0;
  if (!pick_device(c, &devices)) GTEST_SKIP() << "no usable CUDA device";
  const Data d = make_data(16, 8, 40, DType::F32, 52);
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const Problem p{d.n, d.h, s.size, s.start, d.v};
  Options o;
  if (c.rank == 1) o.softcap = 30.0f;
  const test::DeviceProblem x(d, o, p, d.w.data() + s.start * d.h);
  const std::string msg = test::error_of([&] {
    cuda::forward_vocab_parallel(c, x.ctx.handle, p, DType::F32, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(),
                                 x.loss.as<float>(), x.lse.as<float>(), o, x.ws.as(), x.ws_bytes, x.ctx.stream);
  });
  EXPECT_NE(msg.find("disagree on softcap"), std::string::npos) << msg;
  comm::free_comm(c);
}

}  // namespace
}  // namespace lcplan::linear_ce
