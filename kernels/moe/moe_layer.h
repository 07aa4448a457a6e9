// One expert-parallel MoE layer on CPUs (fp32 fixed-order GEMMs, MPI all-to-all; moe_cpu.cpp), run by the chunked schedule
// (chunk_schedule.h): router -> permute -> dispatch -> grouped SwiGLU experts -> combine -> unpermute, plus the
// shared expert; backward with per-chunk dgrad and a delayed wgrad. Communication steps are non-blocking MPI
// calls polled between GEMM row blocks, so chunk i's all-to-all runs while chunk j computes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/comm/comm.h"
#include "parallel/chunk_schedule.h"
#include "kernels/moe/moe_math.h"

namespace lcplan::moe {

struct MoeConfig {
  int hidden = 0;
  int experts = 0;
  int top_k = 0;
  int expert_ffn = 0;        // intermediate size of one routed expert
  int shared_ffn = 0;        // total intermediate size of the shared expert(s); 0 = none
  bool shared_gate = false;  // Qwen: sigmoid(x . g) scales the shared expert output
  Router router = Router::SoftmaxTopK;
  int n_group = 1;
  int topk_group = 1;
  bool normalize = true;
  float scale = 1.0f;
};

RouterParams router_params(const MoeConfig& c);

// One sentence naming the first bad field of `c` for an EP group of `ep_size` ranks, or empty when valid.
std::string moe_config_error(const MoeConfig& c, int ep_size);

// Weights held by one EP rank: router and shared expert replicated, routed experts
// [first_expert, first_expert + local_experts). Row-major matrices.
struct MoeWeights {
  int first_expert = 0;
  int local_experts = 0;
  std::vector<float> router;       // hidden x experts
  std::vector<float> expert_bias;  // experts (selection only, not trained by gradient)
  std::vector<float> w1;           // local x hidden x 2*ffn  ([gate | up] columns)
  std::vector<float> w2;           // local x ffn x hidden
  std::vector<float> shared_w1;    // hidden x 2*shared_ffn
  std::vector<float> shared_w2;    // shared_ffn x hidden
  std::vector<float> shared_gate;  // hidden (when shared_gate)
};

// Deterministic weights whose values depend only on (seed, tensor, global index): the shards of EP ranks
// are slices of the single-rank weights. Throws std::invalid_argument when ep_size does not divide experts.
MoeWeights make_weights(const MoeConfig& c, int ep_rank, int ep_size, uint64_t seed);
MoeWeights zeros_like(const MoeWeights& w);

struct ExecOptions {
  bool overlap = true;  // false: every communication step is waited on as soon as it is issued (serial baseline)
  int poll_rows = 64;   // GEMM row block between progress polls of the in-flight all-to-all (at least 1)
};

// Wall time of each step of a pass (seconds since the pass began), indexed like the schedule's steps.
struct StepTime {
  double start = 0, end = 0;
};

// Per-chunk buffers kept from forward to backward. The backward reads row_of_slot, recv_by_block, the count and
// displacement vectors, xe, h1, act and yp; xp, xr and ye_src are forward-only and may be released in between.
struct ChunkBuffers {
  int t0 = 0, t1 = 0;
  std::vector<int> row_of_slot;          // slot (t - t0) * K + k -> row of xp / yp
  std::vector<int64_t> send_by_expert;   // rows sent to each global expert
  std::vector<int64_t> recv_by_block;    // rows received per (source rank, local expert)
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;  // elements per peer
  std::vector<float> xp, xr, xe, h1, act, ye_src, yp;
  std::vector<float> dyp, dyr, dye, dh1, dx_src, dxp;
};

struct MoeSaved {
  int tokens = 0;
  const float* x = nullptr;              // the caller keeps the input alive until backward
  std::vector<float> scores;             // tokens x experts (softmax or sigmoid)
  std::vector<int> idx;                  // tokens x top_k
  std::vector<float> w;                  // tokens x top_k
  std::vector<int64_t> counts_send, counts_recv;  // [peer][chunk][local expert]
  std::vector<float> sh1, sact, sout, sgate;      // shared expert
  std::vector<ChunkBuffers> chunks;
  std::vector<float> dw, dx_routed, dx_shared;
};

// Collective argument check (every rank of `ep` calls it; all of them throw the same std::invalid_argument):
// EP dividing experts, top-k and groups in range, chunks <= local tokens on every rank, same config everywhere.
void check_moe_args(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s);

// out[tokens x hidden] = MoE(x). Calls check_moe_args first. For the same EP group, outputs and gradients are
// bit-identical for every chunk count and chunk weights, with or without overlap (cpu_gemm.h's fixed summation
// order; the delayed wgrad sums each expert's rows in the unchunked order).
void moe_forward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                 const float* x, int tokens, float* out, MoeSaved& saved, const ExecOptions& o = {},
                 std::vector<StepTime>* times = nullptr);

// dx[tokens x hidden] and this rank's weight grads (replicated router/shared grads are partial sums over this
// rank's tokens; reducing them over EP/DP is the caller's job).
void moe_backward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                  MoeSaved& saved, const float* dout, float* dx, MoeWeights& grads, const ExecOptions& o = {},
                  std::vector<StepTime>* times = nullptr);

}  // namespace lcplan::moe
