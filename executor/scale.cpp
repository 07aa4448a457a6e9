#include "executor/scale.h"

#include <algorithm>
#include <numeric>

#include "common/user_error.h"
#include "estimator/frameworks.h"
#include "estimator/packing.h"

namespace lcplan::exec {

namespace {

// Widths are divided by k, rounded down to a multiple of `unit` (8, or lcm(8, tp) for a width TP splits) and kept at
// least one unit (small enough to run, wide enough that every kernel's tile and RoPE's even rotary dims still apply
// and every TP rank gets whole columns).
int width(int v, int k, int unit = 8) {
  if (v <= 0 || k <= 1) return v;
  const int w = v / k / unit * unit;
  return std::max(unit, std::min(v, w));
}

// Head-count factor: the largest f dividing K and every head count in `counts` such that each counts[i] / f stays a
// multiple of keep[i] (tp for attention and value heads: heads split over TP ranks, estimator/plan_rules.h TpHeads;
// cp * tp for gated DeltaNet key heads: head-parallel CP, CpLinearHeads).
int head_factor(int k, const std::vector<int>& counts, const std::vector<int>& keep) {
  int g = k;
  for (int c : counts) g = std::gcd(g, std::max(c, 1));
  for (int f = g; f >= 1; --f) {
    bool ok = g % f == 0;
    for (size_t i = 0; i < counts.size() && ok; ++i) ok = (counts[i] / f) % std::max(1, keep[i]) == 0;
    if (ok) return f;
  }
  return 1;
}

void note(std::vector<std::string>* notes, const std::string& what, long before, long after) {
  if (notes && before != after) notes->push_back(what + " " + std::to_string(before) + " -> " + std::to_string(after));
}

}  // namespace

std::string layer_kind_name(const LayerSpec& l) {
  std::string s = l.mixer == MixerKind::FullAttention ? "full_attention"
                  : l.mixer == MixerKind::LinearAttention ? "linear_attention"
                                                          : "mla";
  if (l.sliding) s += "(sliding)";
  s += l.ffn == FfnKind::MoE ? "+moe" : "+dense";
  return s;
}

void check_scale_options(const ScaleOptions& s) {
  if (s.factor < 1 || s.factor > 4096)
    throw UserError("--scale " + std::to_string(s.factor) + " is out of range (valid: 1 to 4096; 1 = full size)");
  if (s.layers_per_kind < 0 || s.layers_per_kind > 100000)
    throw UserError("--layers " + std::to_string(s.layers_per_kind) +
                    " is out of range (valid: 0 = every layer, or N layers of each kind)");
}

ModelSpec scale_model(const ModelSpec& m, const ScaleOptions& s, const Parallel& q, std::vector<std::string>* notes,
                      std::vector<int>* kept) {
  check_scale_options(s);
  const int k = s.factor;
  ModelSpec o = m;
  if (k > 1 || s.layers_per_kind > 0)
    o.name = m.name + " (scale " + std::to_string(k) +
             (s.layers_per_kind > 0 ? ", " + std::to_string(s.layers_per_kind) + " layers per kind" : "") + ")";
  const int tp = std::max(1, q.tp), tp_unit = std::lcm(8, tp);
  if (k > 1) {
    o.hidden = width(m.hidden, k);
    note(notes, "hidden", m.hidden, o.hidden);
    o.vocab = std::max(std::lcm(64, tp_unit), m.vocab / k / tp_unit * tp_unit);  // vocabulary-parallel rows per TP rank
    note(notes, "vocab", m.vocab, o.vocab);
    o.dense_ffn = width(m.dense_ffn, k, tp_unit);
    note(notes, "dense_ffn", m.dense_ffn, o.dense_ffn);
    if (m.attn.heads > 0) {
      const int f = head_factor(k, {m.attn.heads, m.attn.kv_heads}, {tp, tp});
      o.attn.heads = m.attn.heads / f;
      o.attn.kv_heads = std::max(1, m.attn.kv_heads / f);
      o.attn.head_dim = width(m.attn.head_dim, k / f);
      o.attn.sliding_window = m.attn.sliding_window > 0 ? std::max(1, m.attn.sliding_window / k) : 0;
      note(notes, "attention heads", m.attn.heads, o.attn.heads);
      note(notes, "kv heads", m.attn.kv_heads, o.attn.kv_heads);
      note(notes, "head_dim", m.attn.head_dim, o.attn.head_dim);
      note(notes, "sliding_window", m.attn.sliding_window, o.attn.sliding_window);
    }
    if (m.mla.heads > 0) {
      MlaSpec& a = o.mla;
      const int f = head_factor(k, {m.mla.heads}, {tp});
      a.heads = m.mla.heads / f;
      a.q_lora_rank = m.mla.q_lora_rank > 0 ? width(m.mla.q_lora_rank, k) : 0;
      a.kv_lora_rank = width(m.mla.kv_lora_rank, k);
      a.qk_nope_head_dim = width(m.mla.qk_nope_head_dim, k / f);
      a.qk_rope_head_dim = width(m.mla.qk_rope_head_dim, k / f);  // a multiple of 8: RoPE's dims stay even
      a.v_head_dim = width(m.mla.v_head_dim, k / f);
      note(notes, "MLA heads", m.mla.heads, a.heads);
      note(notes, "q_lora_rank", m.mla.q_lora_rank, a.q_lora_rank);
      note(notes, "kv_lora_rank", m.mla.kv_lora_rank, a.kv_lora_rank);
      note(notes, "qk_nope_head_dim", m.mla.qk_nope_head_dim, a.qk_nope_head_dim);
      note(notes, "qk_rope_head_dim", m.mla.qk_rope_head_dim, a.qk_rope_head_dim);
      note(notes, "v_head_dim", m.mla.v_head_dim, a.v_head_dim);
    }
    if (m.linear.key_heads > 0) {
      const int f = head_factor(k, {m.linear.key_heads, m.linear.value_heads}, {std::max(1, q.cp * tp), tp});
      o.linear.key_heads = m.linear.key_heads / f;
      o.linear.value_heads = m.linear.value_heads / f;
      o.linear.key_head_dim = width(m.linear.key_head_dim, k / f);
      o.linear.value_head_dim = width(m.linear.value_head_dim, k / f);
      note(notes, "linear key heads", m.linear.key_heads, o.linear.key_heads);
      note(notes, "linear value heads", m.linear.value_heads, o.linear.value_heads);
      note(notes, "linear key_head_dim", m.linear.key_head_dim, o.linear.key_head_dim);
      note(notes, "linear value_head_dim", m.linear.value_head_dim, o.linear.value_head_dim);
    }
    if (m.moe.num_experts > 0) {
      MoeSpec& e = o.moe;
      const int ep = std::max(1, q.ep * q.etp);
      // At least 2*top_k experts so routing still chooses, a multiple of EP, never more than the model has.
      int n = std::max((m.moe.num_experts + k - 1) / k, 2 * m.moe.top_k);
      n = (n + ep - 1) / ep * ep;
      if (n > m.moe.num_experts) n = m.moe.num_experts;
      e.num_experts = n;
      e.top_k = std::min(m.moe.top_k, n);
      e.expert_ffn = width(m.moe.expert_ffn, k, std::lcm(8, std::max(1, q.etp)));  // ETP splits each expert's columns
      e.shared_ffn = m.moe.shared_ffn > 0 ? width(m.moe.shared_ffn, k, tp_unit) : 0;
      if (n % std::max(1, e.n_group) != 0 || e.topk_group * (n / std::max(1, e.n_group)) < e.top_k) {
        e.n_group = 1;
        e.topk_group = 1;
      }
      note(notes, "experts", m.moe.num_experts, e.num_experts);
      note(notes, "top_k", m.moe.top_k, e.top_k);
      note(notes, "expert_ffn", m.moe.expert_ffn, e.expert_ffn);
      note(notes, "shared_ffn", m.moe.shared_ffn, e.shared_ffn);
      note(notes, "router groups", m.moe.n_group, e.n_group);
    }
  }
  // --layers N: the first N layers of each kind, in model order.
  std::vector<int> keep;
  if (s.layers_per_kind > 0) {
    std::vector<std::pair<std::string, int>> seen;
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const std::string kind = layer_kind_name(m.layers[i]);
      auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == kind; });
      if (it == seen.end()) it = seen.insert(seen.end(), {kind, 0});
      if (it->second++ < s.layers_per_kind) keep.push_back(int(i));
    }
    o.layers.clear();
    for (int i : keep) o.layers.push_back(m.layers[i]);
    note(notes, "decoder layers", long(m.layers.size()), long(o.layers.size()));
  } else {
    for (size_t i = 0; i < m.layers.size(); ++i) keep.push_back(int(i));
  }
  if (kept) *kept = keep;
  if (m.mtp_layers > 0) note(notes, "MTP modules (not built by lcplan-exec)", m.mtp_layers, 0);
  o.mtp_layers = 0;
  o.published_total_params = 0;
  o.published_active_params = 0;
  return o;
}

Plan scale_plan(const Plan& p, const ModelSpec& scaled, const ScaleOptions& s, std::vector<std::string>* notes) {
  Plan o = p;
  const int64_t unit = sequence_multiple(p);
  if (s.factor > 1 && !p.packed_lengths.empty()) {
    // A packed microbatch: each sequence scaled alone (the sum of squares keeps its shape), seq_len their sum.
    o.seq_len = 0;
    for (int64_t& l : o.packed_lengths) o.seq_len += l = std::max<int64_t>(unit, l / s.factor / unit * unit);
    note(notes, "seq_len (sum of the packed sequences)", long(p.seq_len), long(o.seq_len));
  } else if (s.factor > 1) {
    o.seq_len = std::max<int64_t>(unit, p.seq_len / s.factor / unit * unit);
    note(notes, "seq_len", long(p.seq_len), long(o.seq_len));
  }
  const int layers = int(scaled.layers.size());
  if (o.recompute_layers > layers) {
    note(notes, "recompute_layers", o.recompute_layers, layers);
    o.recompute_layers = layers;
  }
  return o;
}

ScaledCase executor_case(const ModelSpec& m, const Plan& p, const ScaleOptions& s) {
  ScaledCase c;
  c.scale = s;
  c.mtp_dropped = m.mtp_layers;
  c.model = scale_model(m, s, p.parallel, &c.notes, &c.kept_layers);
  c.plan = scale_plan(p, c.model, s, &c.notes);
  return c;
}

std::string executor_support_error(const ModelSpec& m, const Plan& p) {
  // lcplan-exec's row of the framework table (estimator/frameworks.h): its kernels' limits and the settings it runs,
  // whatever implementation the plan names.
  return framework_support_error(*find_framework("lcplan-exec"), m, p);
}

}  // namespace lcplan::exec
