#include "models/params.h"

namespace lcplan {

namespace {

// Full (GQA) attention: q (with optional per-head output gate), k, v, o.  Source: HF Qwen3-Next modeling
// (q_proj emits 2*heads*head_dim when gated) and Megatron theoretical_memory_usage.py for GQA.
void full_attention(const ModelSpec& m, LayerParams& p) {
  const AttentionSpec& a = m.attn;
  const double h = m.hidden, q = double(a.heads) * a.head_dim, kv = double(a.kv_heads) * a.head_dim;
  p.mixer = h * q * (a.output_gate ? 2 : 1) + 2 * h * kv + q * h;
  if (a.qkv_bias) p.mixer += q + 2 * kv;
  if (a.o_bias) p.mixer += h;
  if (a.qk_norm) p.mixer_replicated += 2.0 * a.head_dim;
  if (a.sinks) p.mixer += a.heads;
}

// Gated DeltaNet: in_proj_qkvz, in_proj_ba, depthwise conv over q,k,v, A_log + dt_bias, gated norm, out_proj.
// Source: HF transformers Qwen3NextGatedDeltaNet parameter shapes.
void linear_attention(const ModelSpec& m, LayerParams& p) {
  const LinearAttentionSpec& g = m.linear;
  const double h = m.hidden, k = double(g.key_heads) * g.key_head_dim, v = double(g.value_heads) * g.value_head_dim;
  p.mixer = h * (2 * k + 2 * v)            // q, k, v, z
            + h * 2.0 * g.value_heads      // b, a
            + (2 * k + v) * g.conv_kernel  // conv1d (depthwise, no bias)
            + v * h;                       // out_proj
  p.mixer_replicated += 2.0 * g.value_heads + g.value_head_dim;  // A_log, dt_bias, RMSNormGated weight
}

// Multi-head latent attention. Source: DeepSeek-V3 report (arXiv 2412.19437) section 2.1.1 / HF DeepseekV3Attention.
// The down-projections (q_a, kv_a) are whole on every TP rank: Megatron-LM builds linear_q_down_proj and
// linear_kv_down_proj with parallel_mode "duplicated" (megatron/core/transformer/multi_latent_attention.py).
void mla(const ModelSpec& m, LayerParams& p) {
  const MlaSpec& a = m.mla;
  const double h = m.hidden, qk = double(a.qk_nope_head_dim) + a.qk_rope_head_dim;
  if (a.q_lora_rank > 0) {
    p.mixer_replicated += h * a.q_lora_rank + a.q_lora_rank;  // q_a and its norm
    p.mixer += double(a.q_lora_rank) * a.heads * qk;            // q_b
  } else {
    p.mixer += h * a.heads * qk;
  }
  p.mixer_replicated += h * (double(a.kv_lora_rank) + a.qk_rope_head_dim) + a.kv_lora_rank;  // kv_a (+ rope key), norm
  p.mixer += double(a.kv_lora_rank) * a.heads * (double(a.qk_nope_head_dim) + a.v_head_dim);  // kv_b
  p.mixer += double(a.heads) * a.v_head_dim * h;                                              // o_proj
}

// An MLP from `width` to `ffn` and back (width: hidden, or the latent width for latent MoE's routed experts).
double mlp(const ModelSpec& m, double width, double ffn, bool bias) {
  const double mats = m.gated_mlp ? 3 : 2;
  double p = mats * width * ffn;
  if (bias) p += (m.gated_mlp ? 2 * ffn : ffn) + width;
  return p;
}

}  // namespace

LayerParams layer_params(const ModelSpec& m, const LayerSpec& layer) {
  LayerParams p;
  switch (layer.mixer) {
    case MixerKind::FullAttention: full_attention(m, p); break;
    case MixerKind::LinearAttention: linear_attention(m, p); break;
    case MixerKind::MLA: mla(m, p); break;
  }
  if (layer.ffn == FfnKind::Dense) {
    p.dense_mlp = mlp(m, m.hidden, m.dense_ffn, false);
  } else {
    const MoeSpec& e = m.moe;
    const double one_expert = mlp(m, routed_width(m), e.expert_ffn, e.expert_bias);
    p.routed_experts = e.num_experts * one_expert;
    p.active_routed = e.top_k * one_expert;
    p.shared_experts = e.shared_experts * mlp(m, m.hidden, e.shared_ffn, false);
    // Latent MoE: hidden -> latent before the routed experts and latent -> hidden after them (Megatron-LM
    // transformer_config.py moe_latent_size; its FLOP count adds these two projections, training.py).
    if (e.latent > 0) p.latent_proj = 2.0 * m.hidden * e.latent;
    p.router = double(m.hidden) * e.num_experts;
    if (e.expert_bias || e.router == RouterKind::SigmoidGroupLimited) p.router += e.num_experts;  // bias / score correction
    if (e.shared_expert_gate) p.router += m.hidden;
  }
  p.norms = 2.0 * m.hidden;
  return p;
}

LayerParams mtp_module_params(const ModelSpec& m) {
  LayerSpec last = m.layers.empty() ? LayerSpec{} : m.layers.back();
  last.sliding = false;
  LayerParams p = layer_params(m, last);
  p.mixer += 2.0 * m.hidden * m.hidden;  // eh_proj
  p.norms += 3.0 * m.hidden;             // enorm, hnorm, final norm of the module
  return p;
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts c;
  c.embedding = double(m.vocab) * m.hidden;
  c.lm_head = m.tied_embeddings ? 0 : double(m.vocab) * m.hidden;
  c.final_norm = m.hidden;
  double active_decoder = 0;
  for (const LayerSpec& l : m.layers) {
    const LayerParams p = layer_params(m, l);
    c.decoder += p.total();
    c.routed_experts += p.routed_experts;
    active_decoder += p.active();
  }
  c.mtp = m.mtp_layers * mtp_module_params(m).total();
  c.total = c.embedding + c.lm_head + c.final_norm + c.decoder;
  c.total_with_mtp = c.total + c.mtp;
  c.active = c.embedding + c.lm_head + c.final_norm + active_decoder;
  return c;
}

}  // namespace lcplan
