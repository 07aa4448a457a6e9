// Case linear_attention: gated DeltaNet forward + backward with its causal conv1d (kernels/linear_attention) by
// sequence; FLOPs counted as estimator/flops.h counts them; gives time.linear_attention_efficiency.
#include "estimator/flops.h"
#include "profiler/cases.h"

namespace lcplan::profiler {

namespace {
double la_forward_flops(int64_t seq, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  ModelSpec m;
  m.linear.key_heads = int(hk);
  m.linear.value_heads = int(hv);
  m.linear.key_head_dim = int(dk);
  m.linear.value_head_dim = int(dv);
  m.linear.conv_kernel = 4;  // linear_attention::Conv's default kernel (Qwen3.5: linear_conv_kernel_dim 4)
  m.hidden = int(hv * dv);
  return layer_forward_flops(m, LayerSpec{MixerKind::LinearAttention, FfnKind::Dense, false}, double(seq)).linear_core;
}
}  // namespace

void run_linear_attention(CaseContext& c) {
  if (c.t.la_seqs.empty()) return;
  int64_t hk = c.t.la_key_heads, hv = c.t.la_value_heads;
  const int64_t dk = c.t.la_key_dim, dv = c.t.la_value_dim;
  int64_t ref = 0;
  for (int64_t s : c.t.la_seqs)
    if (s <= 4096) ref = s;
  if (ref == 0) ref = c.t.la_seqs.front();
  const int64_t group = std::max<int64_t>(1, hv / hk);
  int64_t heads = hv;
  const std::string shrunk = shrink_to_budget(
      {{"value heads", &heads, group, 0}, {"value heads", &heads, 1, 1}},
      [&] { return 3 * la_forward_flops(ref, std::max<int64_t>(1, heads / group), heads, dk, dv); }, c.budget());
  hv = heads;
  hk = std::max<int64_t>(1, hv / group);
  if (hv % hk) hk = hv;
  if (!shrunk.empty()) c.note("linear_attention: " + shrunk + " (key heads " + std::to_string(hk) +
                              ") to fit the CPU budget of " + gflop(c.budget()) + " per call");
  std::string skipped;
  for (int64_t s : c.t.la_seqs) {
    const double f = la_forward_flops(s, hk, hv, dk, dv);
    if (c.budget() > 0 && 3 * f > c.budget()) {
      skipped.append(skipped.empty() ? "" : ",").append(std::to_string(s));  // append: GCC 12 -Wrestrict false positive on operator+
      continue;
    }
    const Timing tm = c.dev.linear_attention(linear_attention::Shape{s, hk, hv, dk, dv});
    c.data.linear_attention.push_back({s, hk, hv, dk, dv, f, tm.seconds});
    c.log("linear_attention seq=" + std::to_string(s) + " heads=" + std::to_string(hk) + "/" + std::to_string(hv) + ": " +
          std::to_string(tm.seconds * 1e3) + " ms");
  }
  if (!skipped.empty()) c.note("linear_attention: sequences " + skipped + " over the CPU budget, not timed");
}

}  // namespace lcplan::profiler
