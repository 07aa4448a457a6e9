#include "profiler/shapes.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "estimator/derived_plan.h"

namespace lcplan::profiler {

std::vector<int64_t> geometric(int64_t lo, int64_t hi, double factor) {
  std::vector<int64_t> v;
  if (lo < 1 || hi < lo || !(factor > 1)) return hi >= 1 ? std::vector<int64_t>{hi} : v;
  for (double x = double(lo); x < double(hi) * (1 - 1e-9); x *= factor) v.push_back(int64_t(std::llround(x)));
  v.push_back(hi);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string shrink_to_budget(const std::vector<Dim>& dims, const std::function<double()>& flops, double budget) {
  if (budget <= 0) return "";
  std::vector<int64_t> before;
  for (const Dim& d : dims) before.push_back(*d.value);
  while (flops() > budget) {
    const Dim* pick = nullptr;
    for (const Dim& d : dims)
      if (*d.value > d.floor && (!pick || d.group < pick->group || (d.group == pick->group && *d.value > *pick->value)))
        pick = &d;
    if (!pick) break;
    *pick->value = std::max(pick->floor, *pick->value / 2);
  }
  std::string note;
  for (size_t i = 0; i < dims.size(); ++i) {
    bool repeated = false;  // two entries may name one dimension (two floors in turn)
    for (size_t j = 0; j < i; ++j) repeated |= dims[j].value == dims[i].value;
    if (!repeated && *dims[i].value != before[i])
      note += (note.empty() ? "" : ", ") + std::string(dims[i].name) + " " + std::to_string(before[i]) + "->" +
              std::to_string(*dims[i].value);
  }
  return note;
}

Targets default_targets(const std::string& backend, bool quick) {
  Targets t;
  const bool cpu = backend == "cpu";
  moe::MoeConfig& c = t.moe;
  if (cpu) {
    // Sized for a few seconds per case on one core (README: the CPU profile of this machine).
    t.gemm_tokens = quick ? std::vector<int64_t>{16, 64, 256, 1024} : geometric(8, 2048, 2);
    t.gemm_classes = quick ? std::vector<GemmClass>{{"512x512", 512, 512}, {"1024x256", 1024, 256}}
                           : std::vector<GemmClass>{{"1024x1024", 1024, 1024}, {"2048x512", 2048, 512}, {"512x2048", 512, 2048}};
    t.grouped_experts = 4, t.grouped_hidden = 512, t.grouped_ffn = 256;
    t.grouped_tokens = quick ? std::vector<int64_t>{4, 16, 64, 256} : geometric(2, 256, 2);
    t.attn_heads = 2, t.attn_kv_heads = 1, t.attn_head_dim = 64;
    t.attn_seqs = quick ? std::vector<int64_t>{64, 256, 1024} : geometric(64, 1024, 2);
    t.la_key_heads = 1, t.la_value_heads = 2, t.la_key_dim = 64, t.la_value_dim = 64;
    t.la_seqs = quick ? std::vector<int64_t>{256, 1024} : geometric(128, 2048, 2);
    t.ce_hidden = 128, t.ce_vocab = 4096, t.ce_token_tile = 256;
    t.ce_tokens = quick ? std::vector<int64_t>{256} : std::vector<int64_t>{128, 512};
    t.ce_vocab_tiles = quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{512, 1024, 2048};
    c.hidden = 256, c.top_k = 2, c.expert_ffn = 128, c.shared_ffn = 128, c.shared_gate = true;
    t.moe_local_experts = 4;
    t.moe_tokens = quick ? std::vector<int64_t>{256} : std::vector<int64_t>{128, 512};
    t.moe_chunks = {1, 2};
    t.min_bytes = 1024, t.max_bytes = quick ? 1 << 20 : 16 << 20, t.step_factor = quick ? 8 : 4;
    // STREAM's rule: arrays of at least 4x the last-level cache (32 MiB on this repository's CI machine).
    t.copy_bytes = quick ? std::vector<double>{64e6, 128e6} : std::vector<double>{32e6, 64e6, 128e6, 256e6};
    t.max_call_flops = quick ? 2e9 : 4e9;
  } else {
    t.gemm_tokens = quick ? std::vector<int64_t>{128, 1024, 8192} : geometric(64, 32768, 2);
    t.gemm_classes = {{"4096x4096", 4096, 4096}, {"8192x2048", 8192, 2048}};
    if (!quick) t.gemm_classes.push_back({"2048x8192", 2048, 8192});
    t.grouped_experts = 16, t.grouped_hidden = 4096, t.grouped_ffn = 1536;
    t.grouped_tokens = quick ? std::vector<int64_t>{32, 256, 2048} : geometric(16, 8192, 2);
    t.attn_heads = 16, t.attn_kv_heads = 4, t.attn_head_dim = 128;
    t.attn_seqs = quick ? std::vector<int64_t>{1024, 4096} : geometric(512, 16384, 2);
    t.la_key_heads = 16, t.la_value_heads = 32, t.la_key_dim = 128, t.la_value_dim = 128;
    t.la_seqs = quick ? std::vector<int64_t>{2048} : geometric(1024, 16384, 2);
    t.ce_hidden = 4096, t.ce_vocab = 65536, t.ce_token_tile = 4096;
    t.ce_tokens = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384};
    t.ce_vocab_tiles = quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{2048, 8192};
    c.hidden = 2048, c.top_k = 8, c.expert_ffn = 768, c.shared_ffn = 0;
    t.moe_local_experts = 16;
    t.moe_tokens = quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{4096, 16384};
    t.moe_chunks = {1, 2};
    t.min_bytes = 8192, t.max_bytes = quick ? 64 << 20 : 512 << 20, t.step_factor = quick ? 8 : 2;
    t.copy_bytes = quick ? std::vector<double>{256e6, 1e9} : std::vector<double>{64e6, 256e6, 1e9, 2e9};
  }
  return t;
}

Targets plan_targets(const ModelSpec& m, const Plan& p, const Hardware& hw, const std::string& backend, bool quick) {
  Targets t = default_targets(backend, quick);
  const DerivedPlan d = derive_plan(m, p, hw);
  const int64_t tp = p.parallel.tp, etp = p.parallel.etp;
  const int64_t local = int64_t(d.local_tokens), hidden_tokens = int64_t(d.hidden_tokens);
  const double factor = quick ? 8 : 4;
  t.plan = m.name + ", " + std::to_string(p.gpus) + " GPUs, seq " + std::to_string(p.seq_len) + ", TP" +
           std::to_string(p.parallel.tp) + " PP" + std::to_string(p.parallel.pp) + " CP" + std::to_string(p.parallel.cp) +
           " EP" + std::to_string(p.parallel.ep) + " ETP" + std::to_string(p.parallel.etp) + ", " +
           std::to_string(d.moe_chunks) + " chunk(s), " + to_string(p.precision) + (p.linear_ce ? ", linear CE" : "");
  const int64_t h = m.hidden;

  // Dense GEMMs: every distinct TP-sharded weight GEMM of the model, by the plan's token counts.
  t.gemm_tokens = geometric(64, local, factor);
  t.gemm_classes.clear();
  std::set<std::pair<int64_t, int64_t>> seen;
  auto add = [&](const char* name, double n, double k) {
    const int64_t ni = std::max<int64_t>(1, int64_t(n)), ki = std::max<int64_t>(1, int64_t(k));
    if (seen.insert({ni, ki}).second) t.gemm_classes.push_back({name, ni, ki});
  };
  bool full = false, linear = false, mla = false, dense = false, moe_layer = false;
  for (const LayerSpec& l : m.layers) {
    full |= l.mixer == MixerKind::FullAttention;
    linear |= l.mixer == MixerKind::LinearAttention;
    mla |= l.mixer == MixerKind::MLA;
    dense |= l.ffn == FfnKind::Dense;
    moe_layer |= l.ffn == FfnKind::MoE;
  }
  if (full) {
    const double q = double(m.attn.heads) * m.attn.head_dim, kv = double(m.attn.kv_heads) * m.attn.head_dim;
    add("attn_qkv", (q * (m.attn.output_gate ? 2 : 1) + 2 * kv) / tp, h);
    add("attn_out", h, q / tp);
  }
  if (linear) {
    const LinearAttentionSpec& g = m.linear;
    const double k = double(g.key_heads) * g.key_head_dim, v = double(g.value_heads) * g.value_head_dim;
    add("gdn_in", (2 * k + 2 * v + 2.0 * g.value_heads) / tp, h);
    add("gdn_out", h, v / tp);
  }
  if (mla) {
    const MlaSpec& a = m.mla;
    const double qk = double(a.qk_nope_head_dim) + a.qk_rope_head_dim;
    add("mla_q", a.heads * qk / tp, a.q_lora_rank > 0 ? a.q_lora_rank : h);
    add("mla_out", h, double(a.heads) * a.v_head_dim / tp);
  }
  const double gate = m.gated_mlp ? 2 : 1;
  if (dense) {
    add("mlp_up", gate * m.dense_ffn / tp, h);
    add("mlp_down", h, double(m.dense_ffn) / tp);
  }
  if (moe_layer && m.moe.shared_experts > 0) {
    const double sf = double(m.moe.shared_experts) * m.moe.shared_ffn;
    add("shared_up", gate * sf / tp, h);
    add("shared_down", h, sf / tp);
  }
  if (moe_layer) add("router", m.moe.num_experts, h);
  add("lm_head", double(m.vocab) / tp, h);

  // Grouped expert GEMMs: experts per rank, tokens per local expert per chunk.
  if (moe_layer) {
    t.grouped_experts = std::max(1, m.moe.num_experts / (p.parallel.ep));
    t.grouped_hidden = h;
    t.grouped_ffn = std::max<int64_t>(1, m.moe.expert_ffn / etp);
    const int64_t per_chunk = std::max<int64_t>(1, int64_t(d.tokens_per_local_expert / d.moe_chunks));
    t.grouped_tokens = geometric(std::min<int64_t>(16, per_chunk), per_chunk, factor);
  } else {
    t.grouped_tokens.clear();
    t.notes.push_back("the model has no MoE layers: no grouped GEMM or MoE layer case");
  }

  // Attention on the local sequence (the estimator keys its efficiency by it), heads of this TP rank.
  if (full) {
    t.attn_heads = std::max<int64_t>(1, m.attn.heads / tp);
    t.attn_kv_heads = std::max<int64_t>(1, m.attn.kv_heads / tp);
    t.attn_head_dim = m.attn.head_dim;
    t.attn_seqs = geometric(std::min<int64_t>(128, local), local, factor);
  } else if (mla) {
    t.attn_heads = t.attn_kv_heads = std::max<int64_t>(1, m.mla.heads / tp);
    t.attn_head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
    t.attn_seqs = geometric(std::min<int64_t>(128, local), local, factor);
    t.notes.push_back("MLA attention timed as multi-head attention with head dim qk_nope + qk_rope");
  } else {
    t.attn_seqs.clear();
  }
  if (linear) {
    t.la_key_heads = std::max<int64_t>(1, m.linear.key_heads / tp);
    t.la_value_heads = std::max<int64_t>(1, m.linear.value_heads / tp);
    t.la_key_dim = m.linear.key_head_dim;
    t.la_value_dim = m.linear.value_head_dim;
    t.la_seqs = geometric(std::min<int64_t>(128, local), local, factor);
  } else {
    t.la_seqs.clear();
  }

  // Loss layer: this rank's tokens and vocabulary share.
  t.ce_hidden = h;
  t.ce_vocab = std::max<int64_t>(1, m.vocab / tp);
  t.ce_tokens = {hidden_tokens};

  // The MoE layer as the plan runs it: experts per rank, its chunk count against no chunking.
  if (moe_layer) {
    moe::MoeConfig& c = t.moe;
    c = moe::MoeConfig{};
    c.hidden = int(h);
    c.top_k = m.moe.top_k;
    c.expert_ffn = int(std::max<int64_t>(1, m.moe.expert_ffn / etp));
    c.shared_ffn = m.moe.shared_experts * m.moe.shared_ffn;
    c.shared_gate = m.moe.shared_expert_gate;
    if (m.moe.router == RouterKind::SigmoidGroupLimited) {
      c.router = moe::Router::SigmoidGroupLimited;
      c.n_group = m.moe.n_group;
      c.topk_group = m.moe.topk_group;
    }
    t.moe_local_experts = t.grouped_experts;
    t.moe_tokens = {hidden_tokens};
    t.moe_chunks = d.moe_chunks > 1 ? std::vector<int>{1, d.moe_chunks} : std::vector<int>{1};
  } else {
    t.moe_tokens.clear();
  }

  // Collectives up to the largest message one call of the plan sends: the EP all-to-all of one chunk, the CP K/V
  // all-gather, a TP all-gather, an FSDP unit's all-gather.
  double largest = 0;
  if (d.has_moe && p.parallel.ep > 1) largest = std::max(largest, d.routed_tokens / d.moe_chunks * h * 2);
  if (p.parallel.cp > 1 && full)
    largest = std::max(largest, double(local) * p.parallel.cp * 2.0 * m.attn.kv_heads * m.attn.head_dim / tp * 2);
  if (tp > 1) largest = std::max(largest, double(local) * h * 2);
  for (const StageRecord& s : d.stages) largest = std::max(largest, s.max_unit * 2);
  // GPUs sweep up to the plan's largest message (at most 4x the default ceiling); CPUs keep their default ceiling.
  if (largest > 0) t.max_bytes = std::min(backend == "cpu" ? t.max_bytes : t.max_bytes * 4, largest);
  t.has_plan_groups = true;
  t.groups = {p.parallel.tp, p.parallel.cp, p.parallel.ep, p.parallel.etp, p.parallel.pp};
  t.notes.push_back("shapes of the plan: " + t.plan + " (local tokens " + std::to_string(local) + ", tokens per local "
                    "expert per chunk " + std::to_string(moe_layer ? t.grouped_tokens.back() : 0) + ")");
  return t;
}

}  // namespace lcplan::profiler
