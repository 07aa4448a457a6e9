#include "executor/exec_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lcplan::exec {

Dims make_dims(const ModelSpec& m, int tp, int tp_rank, int etp, int etp_rank) {
  Dims d;
  d.H = m.hidden;
  d.V = m.vocab;
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.Vl = m.vocab / tp;  // Megatron pads the vocabulary to a multiple of tp; the scale rules keep it divisible
  d.V0 = tp_rank * d.Vl;
  d.tied = m.tied_embeddings;
  d.hq = m.attn.heads / tp;
  d.hkv = m.attn.kv_heads / tp;
  d.hd = m.attn.head_dim;
  d.gate = m.attn.output_gate;
  d.qk_norm = m.attn.qk_norm;
  d.qkv_bias = m.attn.qkv_bias;
  d.window = m.attn.sliding_window;
  // RoPE rotates an even number of leading dims (partial rotary: Qwen3.5 rotates a quarter of head_dim).
  d.rotary = std::max(0, int(m.attn.partial_rotary * m.attn.head_dim) / 2 * 2);
  if (std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.mixer == MixerKind::MLA; })) {
    const MlaSpec& a = m.mla;  // MLA models have no other attention (models/hf_config.cpp)
    d.hq = d.hkv = a.heads / tp;
    d.hd = a.qk_nope_head_dim + a.qk_rope_head_dim;
    d.rotary = a.qk_rope_head_dim;
    d.gate = d.qk_norm = false;
    d.window = 0;
    d.mla_ql = a.q_lora_rank;
    d.mla_kvl = a.kv_lora_rank;
    d.mla_nope = a.qk_nope_head_dim;
    d.mla_rope = a.qk_rope_head_dim;
    d.mla_vd = a.v_head_dim;
  }
  d.lk = m.linear.key_heads / tp;
  d.lv = m.linear.value_heads / tp;
  d.lv_first = tp_rank * d.lv;
  d.dk = m.linear.key_head_dim;
  d.dv = m.linear.value_head_dim;
  d.conv = m.linear.conv_kernel;
  d.F = m.dense_ffn / tp;
  d.etp = etp;
  d.etp_rank = etp_rank;
  const int shared = m.moe.shared_experts * m.moe.shared_ffn;
  d.shared_local = shared / tp;
  d.shared_gate = m.moe.shared_expert_gate;
  moe::MoeConfig& c = d.moe;
  c.hidden = m.hidden;
  c.experts = m.moe.num_experts;
  c.top_k = m.moe.top_k;
  c.expert_ffn = m.moe.expert_ffn;
  // Without TP the kernel runs the shared expert on the layer's tokens; under TP it is a column/row-parallel MLP over
  // the all-gathered sequence (Megatron SharedExpertMLP), which the executor runs itself.
  c.shared_ffn = tp == 1 ? shared : 0;
  c.shared_gate = tp == 1 && m.moe.shared_expert_gate;
  c.router = m.moe.router == RouterKind::SigmoidGroupLimited ? moe::Router::SigmoidGroupLimited : moe::Router::SoftmaxTopK;
  c.n_group = m.moe.n_group;
  c.topk_group = m.moe.topk_group;
  return d;
}

size_t global_index(const TensorSpec& t, size_t i) {
  size_t lc = 0;
  for (const Span& s : t.cols) lc += s.count;
  size_t r = i / lc, c = i % lc, gr = 0, gc = 0;
  for (const Span& s : t.rows) {
    if (r < s.count) {
      gr = s.first + r;
      break;
    }
    r -= s.count;
  }
  for (const Span& s : t.cols) {
    if (c < s.count) {
      gc = s.first + c;
      break;
    }
    c -= s.count;
  }
  return gr * t.global_cols + gc;
}

namespace {

size_t span_sum(const std::vector<Span>& v) {
  size_t n = 0;
  for (const Span& s : v) n += s.count;
  return n;
}

struct Builder {
  UnitLayout u;
  // A [rows x cols] slice (global row and column spans) of a tensor `global_cols` wide.
  size_t add(const std::string& name, size_t global_cols, std::vector<Span> rows, std::vector<Span> cols, Init init,
             float scale, bool expert = false, bool replicated = false) {
    TensorSpec t;
    t.name = name;
    t.expert = expert;
    t.global_cols = global_cols;
    t.size = span_sum(rows) * span_sum(cols);
    t.rows = std::move(rows);
    t.cols = std::move(cols);
    t.tp_replicated = replicated;
    t.init = init;
    t.scale = scale;
    size_t& n = expert ? u.n_expert : u.n_dense;
    t.offset = n;
    n += t.size;
    u.tensors.push_back(t);
    return t.offset;
  }
  // A vector every TP rank holds whole (norm weights, router, per-head decay parameters).
  size_t vec(const std::string& name, size_t n, Init init, float scale) {
    return add(name, n, {{0, 1}}, {{0, n}}, init, scale, false, true);
  }
  // Whole rows by this rank's column spans (column-parallel, Megatron ColumnParallelLinear).
  size_t col_par(const std::string& name, size_t rows, size_t global_cols, std::vector<Span> cols, float scale) {
    return add(name, global_cols, {{0, rows}}, std::move(cols), Init::Uniform, scale);
  }
  // This rank's row spans by whole columns (row-parallel, Megatron RowParallelLinear; vocabulary-parallel tables).
  size_t row_par(const std::string& name, std::vector<Span> rows, size_t cols, float scale) {
    return add(name, cols, std::move(rows), {{0, cols}}, Init::Uniform, scale);
  }
};

float fan_in(double n) { return float(std::sqrt(3.0 / std::max(1.0, n))); }  // uniform with variance 1 / fan_in

// Full attention's tensors: this rank's heads of the q, gate, k, v projections and o_proj, q/k norms, biases.
void add_attention(Builder& b, const ModelSpec& m, const Dims& d) {
  LayerOffsets& o = b.u.off;
  const size_t H = d.H, t = d.tp_rank;
  // Whole-model widths (the initialiser's scale) and this rank's heads: q, gate, k, v column blocks.
  const size_t qg = size_t(m.attn.heads) * d.hd, kvg = size_t(m.attn.kv_heads) * d.hd;
  const size_t ql = d.q_cols(), kvl = d.kv_cols(), gq = d.gate ? 2 : 1;
  std::vector<Span> cols = {{t * ql, ql}};
  if (d.gate) cols.push_back({qg + t * ql, ql});
  cols.push_back({gq * qg + t * kvl, kvl});
  cols.push_back({gq * qg + kvg + t * kvl, kvl});
  o.w_qkv = b.col_par("w_qkv", H, gq * qg + 2 * kvg, cols, fan_in(H));
  // q/k/v biases (GLM-4.5 attention_bias; gated models have none): column-parallel like the weight. Initialised
  // non-zero (HF zeroes them) so that their gradients are tested.
  if (d.qkv_bias) o.b_qkv = b.add("b_qkv", gq * qg + 2 * kvg, {{0, 1}}, cols, Init::Uniform, 0.1f);
  o.wo = b.row_par("w_o", {{t * ql, ql}}, H, fan_in(qg));
  if (d.qk_norm) {
    o.q_norm = b.vec("q_norm", d.hd, Init::Ones, 0);
    o.k_norm = b.vec("k_norm", d.hd, Init::Ones, 0);
  }
}

// Gated DeltaNet's tensors: in_proj, conv1d, the gates' parameters, the gated norm and out_proj, split by heads.
void add_gated_deltanet(Builder& b, const ModelSpec& m, const Dims& d) {
  LayerOffsets& o = b.u.off;
  const size_t H = d.H, t = d.tp_rank;
  // in_proj columns [q | k | v | z | b | a] and conv1d channels [q | k | v], each split by heads.
  const size_t kg = size_t(m.linear.key_heads) * d.dk, vg = size_t(m.linear.value_heads) * d.dv;
  const size_t lvg = m.linear.value_heads, kl = d.kdim(), vl = d.vdim(), lvl = d.lv;
  o.w_in = b.col_par("w_in", H, 2 * kg + 2 * vg + 2 * lvg,
                     {{t * kl, kl}, {kg + t * kl, kl}, {2 * kg + t * vl, vl}, {2 * kg + vg + t * vl, vl},
                      {2 * kg + 2 * vg + t * lvl, lvl}, {2 * kg + 2 * vg + lvg + t * lvl, lvl}},
                     fan_in(H));
  o.conv = b.add("conv1d", d.conv, {{t * kl, kl}, {kg + t * kl, kl}, {2 * kg + t * vl, vl}}, {{0, size_t(d.conv)}},
                 Init::Uniform, fan_in(d.conv));
  o.a_log = b.vec("A_log", lvg, Init::ALog, 0);
  o.dt_bias = b.vec("dt_bias", lvg, Init::DtBias, 0);
  o.gnorm = b.vec("gated_norm", d.dv, Init::Ones, 0);
  o.w_out = b.row_par("w_out", {{t * vl, vl}}, H, fan_in(vg));
}

// Multi-head latent attention's tensors.
void add_mla(Builder& b, const ModelSpec& m, const Dims& d) {
  LayerOffsets& o = b.u.off;
  const size_t H = d.H, t = d.tp_rank;
  // MLA (DeepSeek-V3, HF DeepseekV3Attention): down-projections and their norms whole on every TP rank, the
  // up-projections column-parallel by heads, o_proj row-parallel. q / q_b columns per head [rope | nope] (a
  // permutation of HF's [nope | rope]: attention sums over the dims, so the model is the same), kv_b columns per
  // head [k_nope | v].
  const size_t hg = m.mla.heads, hl = d.hq, qk = d.hd, kvb = size_t(d.mla_nope + d.mla_vd), vd = d.mla_vd;
  const size_t ql = d.mla_ql, kvl = d.mla_kvl, kva = size_t(d.mla_kvl + d.mla_rope);
  if (ql > 0) {
    o.mla_qa = b.add("mla_q_a", ql, {{0, H}}, {{0, ql}}, Init::Uniform, fan_in(H), false, true);
    o.mla_qa_norm = b.vec("mla_q_a_norm", ql, Init::Ones, 0);
    o.mla_q = b.col_par("mla_q_b", ql, hg * qk, {{t * hl * qk, hl * qk}}, fan_in(ql));
  } else {
    o.mla_q = b.col_par("mla_q", H, hg * qk, {{t * hl * qk, hl * qk}}, fan_in(H));
  }
  o.mla_kva = b.add("mla_kv_a", kva, {{0, H}}, {{0, kva}}, Init::Uniform, fan_in(H), false, true);
  o.mla_kv_norm = b.vec("mla_kv_a_norm", kvl, Init::Ones, 0);
  o.mla_kvb = b.col_par("mla_kv_b", kvl, hg * kvb, {{t * hl * kvb, hl * kvb}}, fan_in(kvl));
  o.wo = b.row_par("w_o", {{t * hl * vd, hl * vd}}, H, fan_in(hg * vd));
}

// The dense SwiGLU MLP: fc1 column-parallel ([gate | up]), fc2 row-parallel.
void add_mlp(Builder& b, const ModelSpec& m, const Dims& d) {
  LayerOffsets& o = b.u.off;
  const size_t H = d.H, t = d.tp_rank;
  const size_t Fg = m.dense_ffn, Fl = d.F;
  o.mlp_w1 = b.col_par("mlp_w1", H, 2 * Fg, {{t * Fl, Fl}, {Fg + t * Fl, Fl}}, fan_in(H));
  o.mlp_w2 = b.row_par("mlp_w2", {{t * Fl, Fl}}, H, fan_in(Fg));
}

// The MoE FFN: router, expert bias, the shared expert (TP-sharded) and this rank's experts (EP, ETP shards).
void add_moe(Builder& b, const ModelSpec& m, const Dims& d, const ModelShard& sh) {
  LayerOffsets& o = b.u.off;
  const size_t H = d.H, t = d.tp_rank;
  const moe::MoeConfig& c = d.moe;
  const size_t E = c.experts, F = c.expert_ffn, L = E / sh.ep_size;
  const size_t Sg = size_t(m.moe.shared_experts) * m.moe.shared_ffn, Sl = d.shared_local;
  // +-1/sqrt(H): every expert's router vector has the same norm, so at initialisation no expert is favoured
  // and routing is balanced in expectation (the estimator's routing_imbalance = 1).
  o.router = b.vec("router", H * E, Init::Sign, float(1.0 / std::sqrt(double(H))));
  if (c.router == moe::Router::SigmoidGroupLimited) o.expert_bias = b.vec("expert_bias", E, Init::Zero, 0);
  if (Sg > 0) {
    o.shared_w1 = b.col_par("shared_w1", H, 2 * Sg, {{t * Sl, Sl}, {Sg + t * Sl, Sl}}, fan_in(H));
    o.shared_w2 = b.row_par("shared_w2", {{t * Sl, Sl}}, H, fan_in(Sg));
  }
  if (d.shared_gate) o.shared_gate = b.vec("shared_gate", H, Init::Uniform, fan_in(H));
  // This rank's experts (global first .. first + L - 1) and, under expert tensor parallelism, its share of each
  // expert's FFN columns ([gate | up] halves of w1, rows of w2).
  const size_t first = size_t(sh.ep_rank) * L, Fe = F / sh.etp_size, f0 = size_t(sh.etp_rank) * Fe;
  o.w1 = b.add("experts_w1", 2 * F, {{first * H, L * H}}, {{f0, Fe}, {F + f0, Fe}}, Init::Uniform, fan_in(H), true);
  std::vector<Span> w2_rows;
  for (size_t e = 0; e < L; ++e) w2_rows.push_back({(first + e) * F + f0, Fe});
  o.w2 = b.add("experts_w2", H, w2_rows, {{0, H}}, Init::Uniform, fan_in(F), true);
}

}  // namespace

std::vector<UnitLayout> model_units(const ModelSpec& m, const Dims& d, const ModelShard& sh) {
  std::vector<UnitLayout> units;
  const size_t H = d.H;
  {
    Builder b;
    b.u.kind = UnitKind::Embedding;
    b.u.id = 0;
    b.u.name = "embedding";
    b.row_par("embedding", {{size_t(d.V0), size_t(d.Vl)}}, H, 1.0f);
    units.push_back(b.u);
  }
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerSpec& l = m.layers[i];
    Builder b;
    b.u.kind = UnitKind::Layer;
    b.u.id = int(1 + i);
    b.u.layer = int(i);
    b.u.name = "layer " + std::to_string(i);
    b.u.off.norm1 = b.vec("norm1", H, Init::Ones, 0);
    if (l.mixer == MixerKind::FullAttention) add_attention(b, m, d);
    else if (l.mixer == MixerKind::LinearAttention) add_gated_deltanet(b, m, d);
    else add_mla(b, m, d);
    b.u.off.norm2 = b.vec("norm2", H, Init::Ones, 0);
    if (l.ffn == FfnKind::Dense) add_mlp(b, m, d);
    else add_moe(b, m, d, sh);
    units.push_back(b.u);
  }
  {
    Builder b;
    b.u.kind = UnitKind::FinalNorm;
    b.u.id = int(m.layers.size()) + 1;
    b.u.name = "final_norm";
    b.vec("final_norm", H, Init::Ones, 0);
    units.push_back(b.u);
  }
  if (!d.tied) {
    Builder b;
    b.u.kind = UnitKind::LmHead;
    b.u.id = int(m.layers.size()) + 2;
    b.u.name = "lm_head";
    b.row_par("lm_head", {{size_t(d.V0), size_t(d.Vl)}}, H, fan_in(H));
    units.push_back(b.u);
  }
  return units;
}

UnitLayout tied_head_copy(const UnitLayout& embedding) {
  UnitLayout u = embedding;
  u.kind = UnitKind::LmHead;
  u.name = "lm_head (tied copy of the embedding)";
  u.shared_copy = true;
  return u;
}

namespace {

// Counter-based generator (splitmix64 finaliser): uniform in [-1, 1), independent of call order.
double hash_uniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + a * 0xD1B54A32D192ED03ull + b * 0xBF58476D1CE4E5B9ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 4503599627370496.0) - 1.0;
}

}  // namespace

float init_value(uint64_t seed, int unit, int tensor, const TensorSpec& t, size_t i) {
  const uint64_t key = uint64_t(unit) * 1024 + uint64_t(tensor);
  const double u = hash_uniform(seed, key, global_index(t, i));
  switch (t.init) {
    case Init::Ones: return 1.0f;
    case Init::Zero: return 0.0f;
    case Init::Uniform: return float(t.scale * u);
    case Init::Sign: return u < 0 ? -t.scale : t.scale;
    case Init::ALog: return float(std::log(1.0 + 7.5 * (u + 1.0)));  // A in [1, 16] (HF Qwen3-Next: uniform(0, 16))
    case Init::DtBias: {
      // dt log-uniform in [1e-3, 1e-1], stored as its inverse softplus (HF Mamba2 / Qwen3-Next dt_bias init).
      const double dt = std::exp(std::log(1e-3) + (u + 1.0) * 0.5 * (std::log(1e-1) - std::log(1e-3)));
      return float(dt + std::log(-std::expm1(-dt)));
    }
  }
  return 0.0f;
}

int64_t data_token(uint64_t seed, int64_t sample, int64_t pos, int vocab) {
  const double u = hash_uniform(seed ^ 0xA5A5A5A5ull, uint64_t(sample) + 1, uint64_t(pos));
  const int64_t t = int64_t((u + 1.0) * 0.5 * vocab);
  return std::min<int64_t>(std::max<int64_t>(t, 0), vocab - 1);
}

}  // namespace lcplan::exec
