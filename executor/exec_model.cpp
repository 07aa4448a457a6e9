#include "executor/exec_model.h"

#include <cmath>
#include <stdexcept>

namespace lcplan::exec {

Dims make_dims(const ModelSpec& m) {
  Dims d;
  d.H = m.hidden;
  d.V = m.vocab;
  d.tied = m.tied_embeddings;
  d.hq = m.attn.heads;
  d.hkv = m.attn.kv_heads;
  d.hd = m.attn.head_dim;
  d.gate = m.attn.output_gate;
  d.qk_norm = m.attn.qk_norm;
  d.window = m.attn.sliding_window;
  // RoPE rotates an even number of leading dims (partial rotary: Qwen3.5 rotates a quarter of head_dim).
  d.rotary = std::max(0, int(m.attn.partial_rotary * m.attn.head_dim) / 2 * 2);
  d.lk = m.linear.key_heads;
  d.lv = m.linear.value_heads;
  d.dk = m.linear.key_head_dim;
  d.dv = m.linear.value_head_dim;
  d.conv = m.linear.conv_kernel;
  d.F = m.dense_ffn;
  moe::MoeConfig& c = d.moe;
  c.hidden = m.hidden;
  c.experts = m.moe.num_experts;
  c.top_k = m.moe.top_k;
  c.expert_ffn = m.moe.expert_ffn;
  c.shared_ffn = m.moe.shared_experts * m.moe.shared_ffn;
  c.shared_gate = m.moe.shared_expert_gate;
  c.router = m.moe.router == RouterKind::SigmoidGroupLimited ? moe::Router::SigmoidGroupLimited : moe::Router::SoftmaxTopK;
  c.n_group = m.moe.n_group;
  c.topk_group = m.moe.topk_group;
  return d;
}

namespace {

struct Builder {
  UnitLayout u;
  size_t add(const std::string& name, size_t size, Init init, float scale, bool expert = false, size_t global_first = 0) {
    TensorSpec t;
    t.name = name;
    t.expert = expert;
    t.size = size;
    t.init = init;
    t.scale = scale;
    t.global_first = global_first;
    size_t& n = expert ? u.n_expert : u.n_dense;
    t.offset = n;
    n += size;
    u.tensors.push_back(t);
    return t.offset;
  }
};

float fan_in(double n) { return float(std::sqrt(3.0 / std::max(1.0, n))); }  // uniform with variance 1 / fan_in

}  // namespace

std::vector<UnitLayout> model_units(const ModelSpec& m, const Dims& d, int ep_rank, int ep_size) {
  std::vector<UnitLayout> units;
  const size_t H = d.H;
  {
    Builder b;
    b.u.kind = UnitKind::Embedding;
    b.u.name = "embedding";
    b.add("embedding", size_t(d.V) * H, Init::Uniform, 1.0f);
    units.push_back(b.u);
  }
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerSpec& l = m.layers[i];
    Builder b;
    b.u.kind = UnitKind::Layer;
    b.u.layer = int(i);
    b.u.name = "layer " + std::to_string(i);
    LayerOffsets& o = b.u.off;
    o.norm1 = b.add("norm1", H, Init::Ones, 0);
    if (l.mixer == MixerKind::FullAttention) {
      o.w_qkv = b.add("w_qkv", H * d.qkv_cols(), Init::Uniform, fan_in(H));
      o.wo = b.add("w_o", size_t(d.q_cols()) * H, Init::Uniform, fan_in(d.q_cols()));
      if (d.qk_norm) {
        o.q_norm = b.add("q_norm", d.hd, Init::Ones, 0);
        o.k_norm = b.add("k_norm", d.hd, Init::Ones, 0);
      }
    } else if (l.mixer == MixerKind::LinearAttention) {
      o.w_in = b.add("w_in", H * d.in_proj_cols(), Init::Uniform, fan_in(H));
      o.conv = b.add("conv1d", size_t(d.conv_channels()) * d.conv, Init::Uniform, fan_in(d.conv));
      o.a_log = b.add("A_log", d.lv, Init::ALog, 0);
      o.dt_bias = b.add("dt_bias", d.lv, Init::DtBias, 0);
      o.gnorm = b.add("gated_norm", d.dv, Init::Ones, 0);
      o.w_out = b.add("w_out", size_t(d.vdim()) * H, Init::Uniform, fan_in(d.vdim()));
    } else {
      throw std::logic_error("model_units: MLA layers are refused before the model is built");
    }
    o.norm2 = b.add("norm2", H, Init::Ones, 0);
    if (l.ffn == FfnKind::Dense) {
      o.mlp_w1 = b.add("mlp_w1", H * 2 * d.F, Init::Uniform, fan_in(H));
      o.mlp_w2 = b.add("mlp_w2", size_t(d.F) * H, Init::Uniform, fan_in(d.F));
    } else {
      const moe::MoeConfig& c = d.moe;
      const size_t E = c.experts, F = c.expert_ffn, S = c.shared_ffn, L = E / ep_size;
      // +-1/sqrt(H): every expert's router vector has the same norm, so at initialisation no expert is favoured
      // and routing is balanced in expectation (the estimator's routing_imbalance = 1).
      o.router = b.add("router", H * E, Init::Sign, float(1.0 / std::sqrt(double(H))));
      if (c.router == moe::Router::SigmoidGroupLimited) o.expert_bias = b.add("expert_bias", E, Init::Zero, 0);
      if (S > 0) {
        o.shared_w1 = b.add("shared_w1", H * 2 * S, Init::Uniform, fan_in(H));
        o.shared_w2 = b.add("shared_w2", S * H, Init::Uniform, fan_in(S));
      }
      if (c.shared_gate) o.shared_gate = b.add("shared_gate", H, Init::Uniform, fan_in(H));
      const size_t first = size_t(ep_rank) * L;  // this rank's experts are global experts first .. first + L - 1
      o.w1 = b.add("experts_w1", L * H * 2 * F, Init::Uniform, fan_in(H), true, first * H * 2 * F);
      o.w2 = b.add("experts_w2", L * F * H, Init::Uniform, fan_in(F), true, first * F * H);
    }
    units.push_back(b.u);
  }
  {
    Builder b;
    b.u.kind = UnitKind::FinalNorm;
    b.u.name = "final_norm";
    b.add("final_norm", H, Init::Ones, 0);
    units.push_back(b.u);
  }
  if (!d.tied) {
    Builder b;
    b.u.kind = UnitKind::LmHead;
    b.u.name = "lm_head";
    b.add("lm_head", size_t(d.V) * H, Init::Uniform, fan_in(H));
    units.push_back(b.u);
  }
  return units;
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
  const double u = hash_uniform(seed, key, t.global_first + i);
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
