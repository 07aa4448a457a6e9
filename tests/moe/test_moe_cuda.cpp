// The GPU MoE layer (NCCL + cuBLAS + moe_kernels_cuda kernels, two streams) against the CPU layer under mpirun: forward
// outputs, input grads and weight grads, for 1-4 chunks, asymmetric chunks, starved experts, overlap on and off,
// fp32 and bf16. Every rank skips together when any rank lacks a usable device (or this node has fewer devices
// than ranks: NCCL cannot put two ranks on one GPU).
#include <cuda_runtime.h>
#include <mpi.h>

#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_cuda.h"
#include "tests/comm/gpu_ranks.h"
#include "tests/comm/mpi_env.h"
#include "tests/moe/layer_util.h"

LCPLAN_MPI_TEST_MAIN;

namespace lcplan::moe::tests {
namespace {

using lcplan::test::gpu_skip_reason;
using lcplan::test::pick_device;
using helpers::DevF;

MoeConfig config(Router kind) {
  MoeConfig c;
  c.hidden = 32;
  c.experts = 8;
  c.top_k = 3;
  c.expert_ffn = 24;
  c.shared_ffn = 16;
  c.shared_gate = true;
  c.router = kind;
  if (kind == Router::SigmoidGroupLimited) {
    c.n_group = 4;
    c.topk_group = 2;
    c.scale = 2.5f;
  }
  return c;
}

Pass gpu_pass(gpu::MoeLayerGpu& layer, const ChunkSchedule& s, const std::vector<float>& x, int tokens,
              const std::vector<float>& dout) {
  DevF d_x(x), d_dout(dout), d_out(x.size()), d_dx(x.size());
  layer.forward(s, d_x.p, tokens, d_out.p);
  layer.backward(s, d_dout.p, d_dx.p);
  CUDA_CHECK(cudaStreamSynchronize(layer.stream()));
  Pass p;
  p.out = d_out.get();
  p.dx = d_dx.get();
  p.grads = layer.grads();
  return p;
}

void expect_close(const Pass& gpu, const Pass& cpu, double tol, const std::string& what) {
  EXPECT_LE(rel_err(gpu.out, cpu.out), tol) << what << " out";
  EXPECT_LE(rel_err(gpu.dx, cpu.dx), tol) << what << " dx";
  const auto a = tensors(gpu.grads), b = tensors(cpu.grads);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(rel_err(*a[i].second, *b[i].second), tol) << what << " " << a[i].first;
}

TEST(MoeGpu, RefusesAnMpiCommunicator) {
  // Checked before any CUDA call, so this runs (and must pass) on machines without a GPU too.
  World W;
  const MoeConfig c = config(Router::SoftmaxTopK);
  const MoeWeights w = make_weights(c, W.c.rank, W.c.size, 1);
  const std::string m = invalid_argument_of([&] { gpu::MoeLayerGpu layer(W.c, c, w); });
  EXPECT_NE(m.find("needs an NCCL communicator"), std::string::npos) << m;
}

TEST(MoeGpu, MatchesCpuLayerForwardAndBackward) {
  const std::string skip = gpu_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  pick_device();
  World W;
  const comm::Comm& mpi = W.c;
  comm::Comm nccl = comm::world_nccl();
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited}) {
    const MoeConfig c = config(kind);
    MoeWeights w = make_weights(c, mpi.rank, mpi.size, 7);
    // Starve experts 2, 3 and 5 under the sigmoid router (and with them group {4,5}): some experts, and with
    // EP = 4 whole ranks, receive no rows, so empty GEMMs and empty all-to-all pairs are exercised.
    if (kind == Router::SigmoidGroupLimited) w.expert_bias[2] = w.expert_bias[3] = w.expert_bias[5] = -10.f;
    const int T = 9 + 4 * mpi.rank;
    const auto x = inputs(T, c.hidden, mpi.rank), dout = inputs(T, c.hidden, 100 + mpi.rank);
    const Pass cpu = run_pass(mpi, c, w, make_chunk_schedule(1), x, T, dout, ExecOptions{false, 64});

    for (bool bf16 : {false, true}) {
      for (bool overlap : {true, false}) {
        gpu::GpuOptions o;
        o.bf16 = bf16;
        o.overlap = overlap;
        o.time_steps = overlap;  // exercise the timing path too
        gpu::MoeLayerGpu layer(nccl, c, w, o);
        // bf16 rounds tokens, weights and activations (8 bits of mantissa): a wrong row or route is O(1) off.
        const double tol = bf16 ? 3e-2 : 1e-4;
        for (int n = 1; n <= 4; ++n)
          for (bool asym : {false, true}) {
            std::vector<double> wts;
            if (asym) wts.assign(n, 1.0), wts[0] = 3.0;
            const ChunkSchedule s = make_chunk_schedule(n, wts);
            const Pass g = gpu_pass(layer, s, x, T, dout);
            expect_close(g, cpu, tol,
                         "router " + std::to_string(int(kind)) + (bf16 ? " bf16" : " fp32") +
                             (overlap ? " overlap" : " serial") + " chunks " + std::to_string(n) +
                             (asym ? " asymmetric" : ""));
            if (o.time_steps) {  // EXPECT, not ASSERT: a rank leaving early would hang the others in NCCL
              const auto ft = layer.step_times(false);
              EXPECT_EQ(ft.size(), s.forward.size());
              for (const StepTime& st : ft) EXPECT_LE(st.start, st.end);
            }
          }
        // What moved matches the counts: every slot dispatched once.
        EXPECT_EQ(layer.traffic().rows_sent, int64_t(T) * c.top_k);
      }
    }
  }
  comm::free_comm(nccl);
}

TEST(MoeGpu, BadInputFailsOnEveryRank) {
  const std::string skip = gpu_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  pick_device();
  comm::Comm nccl = comm::world_nccl();
  const MoeConfig c = config(Router::SoftmaxTopK);
  const MoeWeights w = make_weights(c, nccl.rank, nccl.size, 1);
  gpu::MoeLayerGpu layer(nccl, c, w, {});
  // More chunks than tokens on rank 0 only: every rank must throw instead of waiting in NCCL.
  const int T = nccl.rank == 0 ? 2 : 8;
  DevF x(size_t(T) * c.hidden), out(size_t(T) * c.hidden);
  const std::string m = invalid_argument_of([&] { layer.forward(make_chunk_schedule(3), x.p, T, out.p); });
  EXPECT_NE(m.find("ep_chunks = 3 is more than the 2 local tokens on EP rank 0"), std::string::npos) << m;
  comm::free_comm(nccl);
}

}  // namespace
}  // namespace lcplan::moe::tests
