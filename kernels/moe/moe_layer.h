// The expert-parallel MoE layer's configuration, weights, argument checks and per-chunk bookkeeping, shared by its
// orchestration (moe_pass.h: router -> permute -> dispatch -> grouped SwiGLU experts -> combine -> unpermute, plus the
// shared expert, run by the chunked schedule of chunk_schedule.h), the CPU layer (moe_cpu.h) and the GPU layer
// (moe_cuda.h).
//
// Expert tensor parallelism (Megatron-LM --expert-tensor-parallel-size, MoEAlltoAllTokenDispatcher): each routed
// expert's FFN columns are split over an ETP group; after the EP dispatch the rows an expert received are
// all-gathered over ETP, every ETP rank runs its columns of fc1 / SwiGLU / fc2 on all of them, and the partial
// outputs are reduce-scattered back (summed in ETP-rank order) to the rank that received them; the backward mirrors
// it. A size-1 ETP group (the overloads without one) is plain EP.
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
  // Expert tensor parallelism: this rank's FFN columns [ffn_first, ffn_first + ffn_local) of every local expert
  // (w1 is local x hidden x 2*ffn_local as [gate | up] of those columns, w2 local x ffn_local x hidden); 0 = all.
  int ffn_first = 0, ffn_local = 0;
};
// FFN columns of each local expert on this rank.
inline int local_ffn(const MoeConfig& c, const MoeWeights& w) { return w.ffn_local > 0 ? w.ffn_local : c.expert_ffn; }

// Deterministic weights whose values depend only on (seed, tensor, global index): the shards of EP ranks
// are slices of the single-rank weights. Throws std::invalid_argument when ep_size does not divide experts.
// With etp_size > 1 the ETP rank's columns of each expert (slices of the same weights).
MoeWeights make_weights(const MoeConfig& c, int ep_rank, int ep_size, uint64_t seed, int etp_rank = 0,
                        int etp_size = 1);
MoeWeights zeros_like(const MoeWeights& w);

struct ExecOptions {
  bool overlap = true;  // false: every communication step is waited on as soon as it is issued (serial baseline)
  int poll_rows = 64;   // GEMM row block between progress polls of the in-flight all-to-all (at least 1)
};

// Wall time of each step of a pass (seconds since the pass began), indexed like the schedule's steps.
struct StepTime {
  double start = 0, end = 0;
};

// Collective argument check (every rank of `ep` calls it; all of them throw the same std::invalid_argument):
// EP dividing experts, top-k and groups in range, chunks <= local tokens on every rank, same config everywhere.
void check_moe_args(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s);
// The same with an ETP group (expert_ffn divisible by it, the weights holding its share, same config on it).
void check_moe_args(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s);

// Row blocks between a source-major buffer (rows as received: by source, then local expert) and the expert-major one
// the GEMMs want, from the rows per (source, local expert): each local expert's first expert-major row and the
// non-empty blocks {source-major first row, expert-major first row, rows}. Under ETP the sources are (ETP rank,
// source rank) pairs in that order. Pure; moe_pass.h's GEMMs read the expert offsets, its reorders the blocks.
struct BlockTable {
  std::vector<int64_t> expert_off;  // local expert e owns expert-major rows [expert_off[e], expert_off[e + 1])
  std::vector<int64_t> blocks;      // non-empty blocks, three values each
  int64_t max_block_rows = 0;
  int nblocks() const { return int(blocks.size() / 3); }
  int64_t rows() const { return expert_off.empty() ? 0 : expert_off.back(); }
};
BlockTable block_table(const std::vector<int64_t>& by_block, int sources, int local_experts);

// The all-to-all layout of chunk `ch` from the counts this rank sends and receives per (peer, chunk, local expert)
// ([peer][chunk][local expert], as exchanged), for rows `hidden` elements wide: the layers' host-side bookkeeping
// (moe_pass.h plan_chunks, the GPU layer moe_cuda.cpp). Pure.
struct ChunkLayout {
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;  // elements per peer (send is rank-major:
                                                                          // experts are contiguous per rank)
  std::vector<int64_t> recv_by_block;  // rows per (source rank, local expert), source-major
  BlockTable table;                    // block_table(recv_by_block): the received rows to expert-major and back
  int64_t rows_sent = 0, rows_received = 0, rows_sent_remote = 0, rows_received_remote = 0;
};
ChunkLayout chunk_layout(const std::vector<int64_t>& counts_send, const std::vector<int64_t>& counts_recv, int ep_size,
                         int ep_rank, int chunks, int local_experts, int hidden, int ch);

// Expert tensor parallelism: the rows per (ETP rank, source rank, local expert) of chunk `ch` that the expert GEMMs of
// every ETP rank run on, from every ETP rank's receive counts ([ETP rank][source][chunk][local expert], the
// all-gathered counts_recv): MoeChunk::by_block (moe_pass.h). Pure.
std::vector<int64_t> etp_by_block(const std::vector<int64_t>& counts_recv_etp, int etp_size, int ep_size, int chunks,
                                  int local_experts, int ch);
// Rows each ETP rank received of a chunk (its part of the gathered rows), from etp_by_block.
std::vector<int64_t> etp_rows(const std::vector<int64_t>& etp_by_block, int etp_size, int ep_size, int local_experts);

}  // namespace lcplan::moe
