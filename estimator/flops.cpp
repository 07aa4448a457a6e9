#include "estimator/flops.h"

#include "models/params.h"

namespace lcplan {

namespace {

// Chunk length of the chunked gated delta rule (fla-org flash-linear-attention chunk_gated_delta_rule, BT = 64).
constexpr double kDeltaChunk = 64;

// An MLP from `width` to `ffn` and back, as models/params.cpp mlp counts its weights.
double mlp_flops(const ModelSpec& m, double width, double ffn) { return 2.0 * (m.gated_mlp ? 3 : 2) * width * ffn; }

}  // namespace

double causal_context(double seq, double window) {
  // Mean over query i of min(i+1, w): s/2 for full causal, w - w^2/(2s) for a window w < s.
  if (window <= 0 || window >= seq) return seq / 2;
  return window - window * window / (2 * seq);
}

double packed_context(double seq, double window, const std::vector<int64_t>& packed) {
  if (packed.empty()) return causal_context(seq, window);
  double keys = 0, tokens = 0;
  for (int64_t l : packed) keys += double(l) * causal_context(double(l), window), tokens += double(l);
  return keys / tokens;
}

LayerFlops layer_forward_flops(const ModelSpec& m, const LayerSpec& layer, double seq, double capacity_factor,
                               const std::vector<int64_t>& packed) {
  LayerFlops f;
  const double h = m.hidden;
  switch (layer.mixer) {
    case MixerKind::FullAttention: {
      const AttentionSpec& a = m.attn;
      const double q = double(a.heads) * a.head_dim, kv = double(a.kv_heads) * a.head_dim;
      f.proj = seq * 2 * (h * q * (a.output_gate ? 2 : 1) + 2 * h * kv + q * h);  // q(+gate), k, v, o
      const double ctx = packed_context(seq, layer.sliding ? a.sliding_window : 0, packed);
      f.attn_core = seq * 4 * q * ctx;  // QK^T + PV over the keys each query sees (causal: half the square)
      break;
    }
    case MixerKind::LinearAttention: {
      const LinearAttentionSpec& g = m.linear;
      const double k = double(g.key_heads) * g.key_head_dim, v = double(g.value_heads) * g.value_head_dim;
      f.proj = seq * 2 * (h * (2 * k + 2 * v) + h * 2.0 * g.value_heads + v * h);  // in_proj qkvz, ba; out_proj
      const double dk = g.key_head_dim, dv = g.value_head_dim;
      // Chunked delta rule (Yang et al. 2024, "Gated Delta Networks", arXiv 2412.06464, WY form), per value head.
      const double per_head = 2 * kDeltaChunk * (3 * dk + 2 * dv) + 6 * dk * dv;
      f.linear_core = seq * (g.value_heads * per_head + 2.0 * g.conv_kernel * (2 * k + v));
      break;
    }
    case MixerKind::MLA: {
      const MlaSpec& a = m.mla;
      const double qk = double(a.qk_nope_head_dim) + a.qk_rope_head_dim;
      double w = a.q_lora_rank > 0 ? h * a.q_lora_rank + double(a.q_lora_rank) * a.heads * qk : h * a.heads * qk;
      w += h * (double(a.kv_lora_rank) + a.qk_rope_head_dim);
      w += double(a.kv_lora_rank) * a.heads * (double(a.qk_nope_head_dim) + a.v_head_dim);
      w += double(a.heads) * a.v_head_dim * h;
      f.proj = seq * 2 * w;  // DeepSeek-V3 report arXiv 2412.19437 section 2.1.1 (no weight absorption in training)
      f.attn_core = seq * 2 * a.heads * (qk + a.v_head_dim) * packed_context(seq, 0, packed);
      break;
    }
  }
  if (layer.ffn == FfnKind::Dense) {
    f.dense_mlp = seq * mlp_flops(m, h, m.dense_ffn);
  } else {
    const MoeSpec& e = m.moe;
    const double copies = e.top_k * (capacity_factor > 0 ? capacity_factor : 1.0);
    f.router = seq * 2 * h * e.num_experts;
    f.routed = seq * copies * mlp_flops(m, routed_width(m), e.expert_ffn);
    f.shared = seq * e.shared_experts * mlp_flops(m, h, e.shared_ffn);
    f.latent = seq * 2 * (2 * h * e.latent);  // down and up projection per token (Megatron-LM's FLOP count)
  }
  return f;
}

LayerTraffic layer_traffic(const ModelSpec& m, const LayerSpec& layer) {
  LayerTraffic t;
  const double h = m.hidden;
  // Input + output width of each GEMM: the tensors a low-precision recipe quantizes (input forward, output
  // gradient backward).
  switch (layer.mixer) {
    case MixerKind::FullAttention: {
      const AttentionSpec& a = m.attn;
      const double q = double(a.heads) * a.head_dim, kv = double(a.kv_heads) * a.head_dim;
      t.mixer_io = (h + q * (a.output_gate ? 2 : 1) + 2 * kv) + (q + h);  // fused QKV(+gate), output projection
      break;
    }
    case MixerKind::LinearAttention: {
      const LinearAttentionSpec& g = m.linear;
      const double k = double(g.key_heads) * g.key_head_dim, v = double(g.value_heads) * g.value_head_dim;
      t.mixer_io = (h + 2 * k + 2 * v + 2.0 * g.value_heads) + (v + h);  // in_proj (qkvz, ba), out_proj
      break;
    }
    case MixerKind::MLA: {
      const MlaSpec& a = m.mla;
      const double qk = double(a.qk_nope_head_dim) + a.qk_rope_head_dim;
      const double q_in = a.q_lora_rank > 0 ? a.q_lora_rank : h;
      t.mixer_io = (h + (a.q_lora_rank > 0 ? a.q_lora_rank : 0) + a.kv_lora_rank + a.qk_rope_head_dim)  // q_a + kv_a
                  + (a.q_lora_rank > 0 ? q_in + a.heads * qk : 0)                                      // q_b
                  + (a.kv_lora_rank + a.heads * (double(a.qk_nope_head_dim) + a.v_head_dim))            // kv_b
                  + (double(a.heads) * a.v_head_dim + h);                                               // output
      break;
    }
  }
  // SwiGLU reads gate and up (2f) and writes f forward; backward reads both again and the output gradient (3f) and
  // writes two gradients (2f): 8f elements per token. A 2-matrix MLP moves f + f forward and 3f backward.
  const double act_per_ffn = m.gated_mlp ? 8 : 5;
  const double up = m.gated_mlp ? 2 : 1;
  auto mlp = [&](double width, double ffn, double& io, double& act) {
    io += (width + up * ffn) + (ffn + width);
    act += act_per_ffn * ffn;
  };
  if (layer.ffn == FfnKind::Dense) {
    mlp(h, m.dense_ffn, t.mlp_io, t.act);
  } else {
    const MoeSpec& e = m.moe;
    mlp(routed_width(m), e.expert_ffn, t.routed_gemm_io, t.routed_act);
    if (e.shared_experts > 0) mlp(h, double(e.shared_experts) * e.shared_ffn, t.mlp_io, t.act);
  }
  return t;
}

double lm_head_forward_flops(const ModelSpec& m, double seq) { return seq * 2.0 * m.hidden * m.vocab; }

double mtp_forward_flops(const ModelSpec& m, double seq, const std::vector<int64_t>& packed) {
  if (m.mtp_layers <= 0 || m.layers.empty()) return 0;
  LayerSpec last = m.layers.back();
  last.sliding = false;
  const double one = seq * 2.0 * (2.0 * m.hidden) * m.hidden  // eh_proj on [embedding; hidden]
                     + layer_forward_flops(m, last, seq, 0, packed).total() + lm_head_forward_flops(m, seq);
  return m.mtp_layers * one;
}

double model_forward_flops(const ModelSpec& m, double seq, const std::vector<int64_t>& packed) {
  double f = lm_head_forward_flops(m, seq) + mtp_forward_flops(m, seq, packed);
  for (const LayerSpec& l : m.layers) f += layer_forward_flops(m, l, seq, 0, packed).total();
  return f;
}

double model_flops_per_step(const ModelSpec& m, const Plan& p) {
  // 3 x forward (backward = 2 x forward), every sequence of the global batch; recompute excluded (Megatron-LM).
  return 3.0 * effective_global_batch(p) * model_forward_flops(m, double(p.seq_len), p.packed_lengths);
}

}  // namespace lcplan
