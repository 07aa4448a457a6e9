// ModelSpec: what a model is made of, independent of any parallel plan.
// Built from a Hugging Face config.json (models/hf_config.h) or a zoo name (models/zoo.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lcplan {

// Token mixer of one decoder layer.
enum class MixerKind : uint8_t {
  FullAttention,    // GQA softmax attention (optionally gated, sliding window, partial rotary)
  LinearAttention,  // gated DeltaNet (Qwen3-Next / Qwen3.5)
  MLA,              // multi-head latent attention (DeepSeek-V3, Kimi-K2, Moonlight)
};

// Feed-forward block of one decoder layer.
enum class FfnKind : uint8_t { Dense, MoE };

struct AttentionSpec {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool output_gate = false;      // Qwen3-Next/3.5 gated attention: q_proj also emits a per-head gate
  double partial_rotary = 1.0;   // fraction of head_dim that is rotary (no effect on size, kept for CP/kernels)
  int sliding_window = 0;        // window for layers marked sliding (0 = none)
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  bool sinks = false;            // gpt-oss learnable softmax sinks (one scalar per head)
};

// Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5 "linear_attention" layers).
struct LinearAttentionSpec {
  int key_heads = 0;
  int value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 0;
};

// Multi-head latent attention (DeepSeek-V2/V3).
struct MlaSpec {
  int heads = 0;
  int q_lora_rank = 0;  // 0 = no query compression (Moonlight)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

enum class RouterKind : uint8_t {
  SoftmaxTopK,         // Qwen / Mixtral / gpt-oss: softmax over experts, take top-k
  SigmoidGroupLimited  // DeepSeek-V3 / Kimi-K2: sigmoid scores + expert bias, top groups then top-k
};

struct MoeSpec {
  int num_experts = 0;
  int top_k = 0;
  int expert_ffn = 0;         // moe_intermediate_size
  int shared_experts = 0;     // number of shared experts (their ffn is shared_ffn each)
  int shared_ffn = 0;         // intermediate size of one shared expert
  bool shared_expert_gate = false;  // Qwen: sigmoid gate on the shared expert output (h -> 1)
  bool expert_bias = false;   // bias in expert linear layers (gpt-oss)
  RouterKind router = RouterKind::SoftmaxTopK;
  int n_group = 1;
  int topk_group = 1;
  int latent = 0;             // latent MoE (--moe-latent-size): routed experts work in this width, 0 = hidden
};

struct LayerSpec {
  MixerKind mixer = MixerKind::FullAttention;
  FfnKind ffn = FfnKind::Dense;
  bool sliding = false;  // full attention restricted to attn.sliding_window
};

struct ModelSpec {
  std::string name;          // zoo name or the path it came from
  int hidden = 0;
  int vocab = 0;
  bool tied_embeddings = false;
  bool gated_mlp = true;     // SwiGLU-style (3 matrices); false = 2-matrix MLP
  int dense_ffn = 0;         // intermediate size of dense MLP layers
  AttentionSpec attn;        // used by FullAttention layers
  LinearAttentionSpec linear;  // used by LinearAttention layers
  MlaSpec mla;               // used by MLA layers
  MoeSpec moe;               // used by MoE layers
  std::vector<LayerSpec> layers;  // decoder layers in order (MTP layers are separate)
  int mtp_layers = 0;        // multi-token-prediction modules (each: a decoder layer like the last one + eh_proj + norms)
  int max_position = 0;

  // Published sizes (from the zoo file's provenance block), 0 when the publisher gives none.
  double published_total_params = 0;
  double published_active_params = 0;
  std::string notes;         // reliability / provenance note carried from the zoo file
};

// The width of what routed experts read, write and exchange: the latent width under latent MoE, else hidden.
inline double routed_width(const ModelSpec& m) { return m.moe.latent > 0 ? m.moe.latent : m.hidden; }

}  // namespace lcplan
