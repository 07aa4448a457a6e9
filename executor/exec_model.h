// The parameters lcplan-exec builds for a model: FSDP units (embedding, each decoder layer, final norm, LM head) with
// every tensor's place in the unit's dense or expert array, shaped so that the counts equal models/params.cpp
// (HF Qwen3-Next / Qwen3.5 shapes), and a counter-based initialiser so that any shard is a slice of the same model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/moe/moe_layer.h"
#include "models/model_spec.h"

namespace lcplan::exec {

// Sizes of one model as one rank computes with them: head counts, FFN widths and vocabulary rows are this tensor-
// parallel rank's share (Megatron's column/row-parallel split, heads divisible by tp), hidden stays whole.
struct Dims {
  int H = 0, V = 0;  // hidden, whole vocabulary
  int tp = 1, tp_rank = 0;
  int V0 = 0, Vl = 0;  // this rank's vocabulary rows [V0, V0 + Vl) (vocabulary-parallel embedding and LM head)
  // full attention (this rank's heads)
  int hq = 0, hkv = 0, hd = 0, rotary = 0;
  bool gate = false, qk_norm = false, qkv_bias = false;
  int window = 0;
  // gated DeltaNet (this rank's heads); A_log and dt_bias are whole on every TP rank (models/params.cpp counts them
  // replicated), this rank reads entries lv_first .. lv_first + lv - 1
  int lk = 0, lv = 0, dk = 0, dv = 0, conv = 0, lv_first = 0;
  int kdim() const { return lk * dk; }  // q and k width
  int vdim() const { return lv * dv; }  // v, z and output width
  int conv_channels() const { return 2 * kdim() + vdim(); }
  int in_proj_cols() const { return 2 * kdim() + 2 * vdim() + 2 * lv; }  // q, k, v, z, b, a
  // multi-head latent attention (DeepSeek-V3): the core attention runs on the fields above with hq = hkv = this rank's
  // heads, hd = nope + rope (q and k laid out [rope | nope] per head, so RoPE turns the leading `rotary` = rope dims)
  // and v zero-padded from mla_vd to hd; the down-projections are whole on every TP rank (Megatron "duplicated")
  int mla_ql = 0, mla_kvl = 0, mla_nope = 0, mla_rope = 0, mla_vd = 0;  // q_lora (0: no query compression), kv_lora
  int mla_v_cols() const { return hq * mla_vd; }
  int mla_kvb_cols() const { return hq * (mla_nope + mla_vd); }  // kv_b output: [k_nope | v] per head
  // attention projection columns: q, gate (when gated), k, v
  int q_cols() const { return hq * hd; }
  int kv_cols() const { return hkv * hd; }
  int qkv_cols() const { return q_cols() * (gate ? 2 : 1) + 2 * kv_cols(); }
  // MLPs
  int F = 0;  // dense ffn columns on this rank
  // The MoE layer as kernels/moe runs it: expert_ffn whole (the weights carry the ETP slice). Under tp > 1 the
  // shared expert is TP-sharded and run by the executor (shared_local columns), so the kernel's shared_ffn is 0.
  moe::MoeConfig moe;
  int shared_local = 0;       // shared-expert columns on this rank (all shared experts together)
  bool shared_gate = false;   // Qwen's sigmoid gate on the shared expert
  int etp = 1, etp_rank = 0;  // expert tensor parallelism: each routed expert's FFN columns split over etp ranks
  bool tied = false;
};
// tp ranks split heads, FFN columns and vocabulary rows (the caller checked divisibility: executor_support_error).
Dims make_dims(const ModelSpec& m, int tp = 1, int tp_rank = 0, int etp = 1, int etp_rank = 0);

enum class Init : uint8_t { Ones, Uniform, Sign, ALog, DtBias, Zero };

// A range [first, first + count) of global row or column indices.
struct Span {
  size_t first = 0, count = 0;
};

struct TensorSpec {
  std::string name;
  bool expert = false;   // lives in the unit's expert array (routed experts of this EP rank)
  size_t offset = 0;     // within the dense or expert array
  size_t size = 0;       // elements on this rank
  // Where this rank's elements sit in the whole tensor, a row-major matrix `global_cols` wide: the rows of `rows` by
  // the columns of `cols`, in order (a TP or ETP shard is a slice of the same model, for the initialiser).
  size_t global_cols = 0;
  std::vector<Span> rows, cols;
  bool tp_replicated = false;  // whole on every TP rank; each computes a partial gradient (summed over TP)
  Init init = Init::Uniform;
  float scale = 1;       // uniform(-scale, scale)
};
// Index in the whole tensor of this rank's element i.
size_t global_index(const TensorSpec& t, size_t i);

// Offsets of a decoder layer's tensors (dense array unless noted).
struct LayerOffsets {
  size_t norm1 = 0, norm2 = 0;
  size_t w_qkv = 0, wo = 0, q_norm = 0, k_norm = 0;                       // full attention (and MLA's wo)
  size_t b_qkv = 0;                                                       // q/k/v biases (GLM-4.5), w_qkv's columns
  size_t mla_qa = 0, mla_qa_norm = 0, mla_q = 0, mla_kva = 0, mla_kv_norm = 0, mla_kvb = 0;  // MLA
  size_t w_in = 0, conv = 0, a_log = 0, dt_bias = 0, gnorm = 0, w_out = 0;  // gated DeltaNet
  size_t mlp_w1 = 0, mlp_w2 = 0;                                          // dense MLP
  size_t router = 0, expert_bias = 0, shared_w1 = 0, shared_w2 = 0, shared_gate = 0;  // MoE, dense part
  size_t w1 = 0, w2 = 0;                                                  // MoE, expert array
};

enum class UnitKind : uint8_t { Embedding, Layer, FinalNorm, LmHead };

struct UnitLayout {
  UnitKind kind = UnitKind::Layer;
  int id = 0;      // index in the whole model's unit list (the initialiser's key: every stage builds the same model)
  int layer = -1;  // decoder layer index
  std::string name;
  size_t n_dense = 0, n_expert = 0;
  std::vector<TensorSpec> tensors;
  LayerOffsets off;
  bool shared_copy = false;  // the last stage's copy of a tied embedding (pp > 1): its gradient is summed with the
                             // first stage's and counted once in the gradient norm
};

// Which shard of the model a rank holds.
struct ModelShard {
  int ep_rank = 0, ep_size = 1;    // routed experts [ep_rank * E/ep, ...)
  int etp_rank = 0, etp_size = 1;  // each routed expert's FFN columns
};

// Every unit of the model in forward order: embedding, decoder layers, final norm, LM head (absent when tied: the
// embedding serves), shaped for this rank's TP shard (`d`) and expert shard.
std::vector<UnitLayout> model_units(const ModelSpec& m, const Dims& d, const ModelShard& s = {});
// The last pipeline stage's copy of a tied embedding (Megatron keeps one there when pp > 1): the embedding's tensors
// and initial values, used as the LM head.
UnitLayout tied_head_copy(const UnitLayout& embedding);

// The value of element i of tensor `t` in unit `unit` (deterministic in seed, unit, tensor and the global index).
float init_value(uint64_t seed, int unit, int tensor, const TensorSpec& t, size_t i);

// Token ids of sample `sample` at positions 0..seq (seq + 1 values: inputs are [0, seq), targets [1, seq]).
int64_t data_token(uint64_t seed, int64_t sample, int64_t pos, int vocab);

}  // namespace lcplan::exec
