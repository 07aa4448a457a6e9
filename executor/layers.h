// Decoder layers of lcplan-exec (full attention, gated DeltaNet, MLA, dense SwiGLU, MoE), the embedding and the loss,
// forward and backward, with the saved tensors the estimator counts (estimator/derived_plan.cpp layer_activation):
// each saved tensor is a bf16 (or fp32 where the estimator says fp32) Buf charged to activations, and a tensor the
// plan's recompute mode drops is rebuilt in the layer's backward. See executor/README.md "Memory mapping".
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "estimator/plan.h"
#include "executor/exec_model.h"
#include "executor/param_store.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/groups.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::exec {

// Everything a layer needs to know about where it runs.
struct Ctx {
  Tracker& tr;
  const Dims& d;
  const comm::ProcessGroups& pg;
  int64_t seq = 0;        // tokens per sequence
  int mb = 1;             // sequences per microbatch
  int cp = 1, cp_rank = 0;
  int64_t seq_local = 0;  // seq / cp: this rank's tokens of one sequence
  int chunks = 1;         // CP chunks per sequence on this rank (2 under load-balanced CP, else 1)
  int64_t chunk_len = 0;  // tokens of one chunk
  int64_t tokens = 0;     // mb * seq_local
  // Tensor parallelism with sequence parallelism (Megatron): hidden-sized tensors (layer inputs and outputs, norm
  // outputs, residuals) hold this rank's `rows` = tokens / tp consecutive token rows; column-parallel GEMMs run on
  // the all-gathered tokens with this rank's heads / columns, row-parallel GEMMs reduce-scatter back to its rows.
  int tp = 1, tp_rank = 0;
  int64_t rows = 0;
  float rope_theta = 10000.0f;
  moe::ChunkSchedule sched{};
  bool linear_ce = false;
  int64_t ce_vocab_tile = 512;
  // A packed (THD) microbatch: its sequences' lengths, summing to seq (mb 1; Megatron's packed_seq_params), each a
  // multiple of 2 cp tp. Positions restart in each, nothing attends across them, and CP splits each one by itself.
  // Empty: mb sequences of seq tokens.
  std::vector<int64_t> segments{};
  // Measured MoE routing on this rank: rows its experts received and token copies it sent.
  double moe_rows_received = 0, moe_rows_sent = 0;
  // Query-key pairs the causal attention kernels covered on this rank (per head, forward), counted by the layers:
  // the sum over sequences of their causal squares, what a packed microbatch's attention cost follows.
  double attention_pairs = 0;

  // Absolute position of local chunk c of a sequence (load-balanced causal CP: chunks r and 2cp-1-r).
  int64_t chunk_start(int c) const;
};

// What a layer keeps from forward to backward (README "What each number means").
enum class Keep : uint8_t { All, Selective, InputOnly };

// Saved tensors of one layer for one microbatch; an empty buffer is a tensor not kept. B is the backend's buffer:
// Buf (host) or cuda::DeviceBuf (layers_cuda.h), the same tensors in the same categories on both.
template <template <class> class B>
struct BasicLayerSaved {
  B<bf16> x;                 // layer input (kept in every mode)
  // full attention
  B<bf16> n1;                // pre-mixer norm output (dropped by selective)
  B<bf16> q, k, v;           // after qk-norm and RoPE (flash-attention inputs)
  B<bf16> o;                 // attention output
  B<float> lse;              // fp32 log-sum-exp [chunk][heads x chunk_len] (dropped by selective)
  B<bf16> gate, go;          // output gate and gated output (o_proj input)
  // MLA (q, k, v, o, lse and n1 above: q and k [heads x (rope | nope)], v and o [heads x v_head_dim])
  B<bf16> mla_qa, mla_qn;    // q_a output and its norm (q_b input), this rank's rows (with query compression)
  B<bf16> mla_kva, mla_kvn;  // kv_a output [kv_lora | rope key] and its norm (kv_b input), this rank's rows
  // gated DeltaNet
  B<bf16> proj;              // in_proj outputs q, k, v, z, b, a
  B<bf16> conv;              // conv1d + SiLU outputs (delta-rule q, k, v)
  B<float> gb;               // decay g and beta, fp32
  B<bf16> la_o, gn;          // delta-rule output, gated-norm output (out_proj input)
  B<float> cp_state;         // CP only: state and conv history entering each segment (not in the estimator)
  // FFN
  B<bf16> r;                 // mid-layer residual, kept in the estimator's pre-FFN norm-output slot (same size)
  B<bf16> fc1, act;          // dense MLP: fc1 output, activation (dropped by selective)
  B<float> logits, probs;    // MoE router logits and probabilities, fp32
  B<bf16> xe, yp, h1, eact;  // MoE: dispatched tokens (expert side), expert outputs before the weighted sum,
                             // expert fc1 output, expert activation (dropped by selective)
  B<bf16> sh1, sact;         // shared expert fc1 output and activation (dropped by selective)
  B<int64_t> moe_meta;       // MoE routing counts per (peer, chunk, local expert) and chunk row offsets
};
using LayerSaved = BasicLayerSaved<Buf>;

// x: the layer's input (bf16 [rows x hidden], owned by sv.x). Writes the layer output into `out` (fp32 [rows x
// hidden], bf16 values).
void layer_forward(Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep, LayerSaved& sv,
                   float* out);
// dout: gradient of the layer output (fp32 [rows x hidden]); dx: gradient of its input (overwritten). Rebuilds
// what `keep` dropped (full recompute reruns the forward), accumulates weight gradients into g, and frees sv.
void layer_backward(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSpec& l, Keep keep,
                    LayerSaved& sv, const float* dout, float* dx);

// The loss over this rank's tokens: final norm, LM head, cross-entropy summed over tokens (linear CE or
// materialized logits), and its backward scaled by grad_scale (1 / tokens of the global batch). Returns the summed
// loss; writes d(layer-stack output) into dx and accumulates the final-norm and LM-head gradients. Under TP the
// final norm runs on this rank's rows, its output is all-gathered and the LM head is vocabulary-parallel (Megatron):
// targets are every local token's, x and dx this rank's rows, and every TP rank returns the whole loss.
double loss_forward_backward(Ctx& c, const bf16* final_norm_w, const bf16* head_w, float* final_norm_g,
                             float* head_g, const float* x, const int64_t* targets, double grad_scale, float* dx);

// The vocabulary-parallel embedding (Megatron VocabParallelEmbedding): rows of `tokens` (every local token) in this
// rank's vocabulary shard, summed over TP into this rank's rows of x (bf16 [rows x hidden]); and its backward: dx
// (this rank's rows) all-gathered and scatter-added into the shard's rows of the gradient g.
void embedding_forward(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x);
void embedding_backward(Ctx& c, const int64_t* tokens, const float* dx, float* g);

}  // namespace lcplan::exec
