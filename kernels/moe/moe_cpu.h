// The CPU MoE layer (lcplan_moe): moe_pass.h on host vectors with the CPU ops of moe_ops_cpu.h (fixed-order fp32
// GEMMs, non-blocking MPI all-to-alls polled between GEMM row blocks). bench/moe/moe_proxy and tests/moe run it, and
// lcplan-exec's host MoE FFN runs the same pass on the same ops. For the same EP group, outputs and gradients are
// bit-identical for every chunk count and chunk weights, with or without overlap (cpu_gemm.h's fixed summation order;
// the delayed wgrad sums each expert's rows in the unchunked order).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_ops_cpu.h"
#include "kernels/moe/moe_pass.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::moe {

namespace cpu {
// The CPU ops on plain host vectors (zeroed when made): the layer's state and scratch are untracked.
struct LayerOps : MoeOps {
  template <class T>
  using Buf = std::vector<T>;
  template <class T>
  std::vector<T> moe_buf(size_t n) { return std::vector<T>(n); }
  std::vector<float> ws(size_t n) { return std::vector<float>(n); }
  std::vector<int64_t> upload(const std::vector<int64_t>& v) { return v; }
};
}  // namespace cpu

// The state kept from forward to backward: moe_pass.h's, and the input (the caller keeps it alive until backward).
struct MoeSaved : MoeState<cpu::LayerOps> {
  const float* x = nullptr;
};
using ChunkBuffers = MoeChunk<cpu::LayerOps>;

// out[tokens x hidden] = MoE(x). Calls check_moe_args first.
void moe_forward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                 const float* x, int tokens, float* out, MoeSaved& saved, const ExecOptions& o = {},
                 std::vector<StepTime>* times = nullptr);

// dx[tokens x hidden] and this rank's weight grads (replicated router/shared grads are partial sums over this
// rank's tokens; reducing them over EP/DP is the caller's job).
void moe_backward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                  MoeSaved& saved, const float* dout, float* dx, MoeWeights& grads, const ExecOptions& o = {},
                  std::vector<StepTime>* times = nullptr);

// With expert tensor parallelism over `etp` (every rank of ep and etp calls them; a size-1 etp is the calls above).
void moe_forward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                 const ChunkSchedule& s, const float* x, int tokens, float* out, MoeSaved& saved,
                 const ExecOptions& o = {}, std::vector<StepTime>* times = nullptr);
void moe_backward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                  const ChunkSchedule& s, MoeSaved& saved, const float* dout, float* dx, MoeWeights& grads,
                  const ExecOptions& o = {}, std::vector<StepTime>* times = nullptr);

// Rebuilds every chunk's routing state (token range, slot rows, all-to-all layout, GEMM rows) and counts_send from
// saved.tokens, saved.idx, saved.counts_recv and (ETP) saved.counts_recv_etp, exactly as the forward set them
// (moe_pass.h plan_chunks without the exchange): what a caller that dropped the layer's state between the passes
// runs before refilling xe, h1, act and yp (lcplan-exec keeps bf16 copies).
void restore_routing(const MoeConfig& c, const MoeWeights& w, int ep_size, int etp_size, const ChunkSchedule& s,
                     MoeSaved& saved);

}  // namespace lcplan::moe
