// Case attention: causal softmax attention forward + backward (kernels/attention) by local sequence; FLOPs counted as
// estimator/flops.h counts them; fits time.attention_efficiency and time.attention_half_seq.
#include "estimator/flops.h"
#include "profiler/cases.h"

namespace lcplan::profiler {

namespace {
double attention_forward_flops(int64_t seq, int64_t heads, int64_t head_dim) {
  ModelSpec m;
  m.hidden = int(heads * head_dim);
  m.attn.heads = int(heads);
  m.attn.kv_heads = int(heads);
  m.attn.head_dim = int(head_dim);
  return layer_forward_flops(m, LayerSpec{MixerKind::FullAttention, FfnKind::Dense, false}, double(seq)).attn_core;
}
}  // namespace

void run_attention(CaseContext& c) {
  if (c.t.attn_seqs.empty()) return;
  int64_t heads = c.t.attn_heads, kv = c.t.attn_kv_heads;
  const int64_t d = c.t.attn_head_dim;
  int64_t ref = 0;
  for (int64_t s : c.t.attn_seqs)
    if (s <= 2048) ref = s;
  if (ref == 0) ref = c.t.attn_seqs.front();
  // Fewer heads first (per-head work is the same), keeping the query/KV grouping while KV heads remain.
  const int64_t group = std::max<int64_t>(1, heads / std::max<int64_t>(1, kv));
  const std::string shrunk = shrink_to_budget({{"heads", &heads, group, 0}, {"heads", &heads, 1, 1}},
                                              [&] { return 3.5 * attention_forward_flops(ref, heads, d); }, c.budget());
  kv = std::max<int64_t>(1, heads / group);
  if (heads % kv) kv = 1;
  if (!shrunk.empty()) c.note("attention: " + shrunk + " (kv heads " + std::to_string(kv) + ") to fit the CPU budget of " +
                              gflop(c.budget()) + " per call");
  std::string skipped;
  for (int64_t s : c.t.attn_seqs) {
    const double f = attention_forward_flops(s, heads, d);
    if (c.budget() > 0 && 3.5 * f > c.budget()) {
      skipped.append(skipped.empty() ? "" : ",").append(std::to_string(s));  // append: GCC 12 -Wrestrict false positive on operator+
      continue;
    }
    const Timing tm = c.dev.attention(attention::Shape{s, s, heads, kv, d});
    c.data.attention.push_back({s, heads, kv, d, f, tm.seconds});
    c.log("attention seq=" + std::to_string(s) + " heads=" + std::to_string(heads) + "/" + std::to_string(kv) + " d=" +
          std::to_string(d) + ": " + std::to_string(tm.seconds * 1e3) + " ms");
  }
  if (!skipped.empty()) c.note("attention: sequences " + skipped + " over the CPU budget, not timed");
}

}  // namespace lcplan::profiler
