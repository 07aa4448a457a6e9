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

// Sizes of one model as the executor computes with them.
struct Dims {
  int H = 0, V = 0;
  // full attention
  int hq = 0, hkv = 0, hd = 0, rotary = 0;
  bool gate = false, qk_norm = false;
  int window = 0;
  // gated DeltaNet
  int lk = 0, lv = 0, dk = 0, dv = 0, conv = 0;
  int kdim() const { return lk * dk; }  // q and k width
  int vdim() const { return lv * dv; }  // v, z and output width
  int conv_channels() const { return 2 * kdim() + vdim(); }
  int in_proj_cols() const { return 2 * kdim() + 2 * vdim() + 2 * lv; }  // q, k, v, z, b, a
  // attention projection columns: q, gate (when gated), k, v
  int q_cols() const { return hq * hd; }
  int kv_cols() const { return hkv * hd; }
  int qkv_cols() const { return q_cols() * (gate ? 2 : 1) + 2 * kv_cols(); }
  // MLPs
  int F = 0;  // dense ffn
  moe::MoeConfig moe;  // shared_ffn = shared_experts * shared_ffn
  bool tied = false;
};
Dims make_dims(const ModelSpec& m);

enum class Init : uint8_t { Ones, Uniform, Sign, ALog, DtBias, Zero };

struct TensorSpec {
  std::string name;
  bool expert = false;   // lives in the unit's expert array (routed experts of this EP rank)
  size_t offset = 0;     // within the dense or expert array
  size_t size = 0;       // elements on this rank (experts: local ones)
  size_t global_first = 0;  // index of element 0 in the whole (all-expert) tensor, for the initialiser
  Init init = Init::Uniform;
  float scale = 1;       // uniform(-scale, scale)
};

// Offsets of a decoder layer's tensors (dense array unless noted).
struct LayerOffsets {
  size_t norm1 = 0, norm2 = 0;
  size_t w_qkv = 0, wo = 0, q_norm = 0, k_norm = 0;                       // full attention
  size_t w_in = 0, conv = 0, a_log = 0, dt_bias = 0, gnorm = 0, w_out = 0;  // gated DeltaNet
  size_t mlp_w1 = 0, mlp_w2 = 0;                                          // dense MLP
  size_t router = 0, expert_bias = 0, shared_w1 = 0, shared_w2 = 0, shared_gate = 0;  // MoE, dense part
  size_t w1 = 0, w2 = 0;                                                  // MoE, expert array
};

enum class UnitKind : uint8_t { Embedding, Layer, FinalNorm, LmHead };

struct UnitLayout {
  UnitKind kind = UnitKind::Layer;
  int layer = -1;  // decoder layer index
  std::string name;
  size_t n_dense = 0, n_expert = 0;
  std::vector<TensorSpec> tensors;
  LayerOffsets off;
};

// Units in forward order: embedding, decoder layers, final norm, LM head (absent when tied: the embedding serves).
// `ep_rank` / `ep_size` select this rank's routed experts.
std::vector<UnitLayout> model_units(const ModelSpec& m, const Dims& d, int ep_rank, int ep_size);

// The value of element i of tensor `t` in unit `unit` (deterministic in seed, unit, tensor and the global index).
float init_value(uint64_t seed, int unit, int tensor, const TensorSpec& t, size_t i);

// Token ids of sample `sample` at positions 0..seq (seq + 1 values: inputs are [0, seq), targets [1, seq]).
int64_t data_token(uint64_t seed, int64_t sample, int64_t pos, int vocab);

}  // namespace lcplan::exec
