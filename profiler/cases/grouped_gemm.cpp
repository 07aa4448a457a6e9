// Case grouped_gemm: the MoE layer's routed-expert forward GEMMs (fc1, SwiGLU, fc2 per local expert) by tokens per
// local expert; fits time.grouped_gemm_efficiency and time.grouped_gemm_half_tokens.
#include "profiler/cases.h"

namespace lcplan::profiler {

void run_grouped_gemm(CaseContext& c) {
  if (c.t.grouped_tokens.empty()) return;
  int64_t experts = c.t.grouped_experts, hidden = c.t.grouped_hidden, ffn = c.t.grouped_ffn;
  int64_t ref = 0;
  for (int64_t x : c.t.grouped_tokens)
    if (x <= 256) ref = x;
  if (ref == 0) ref = c.t.grouped_tokens.front();
  auto flops = [&](int64_t t) { return 6.0 * double(experts) * double(t) * double(hidden) * double(ffn); };
  // Fewer experts first (each expert's GEMM keeps its shape), then hidden and ffn.
  const std::string shrunk = shrink_to_budget({{"local experts", &experts, 1, 0}, {"hidden", &hidden, 256, 1}, {"ffn", &ffn, 128, 1}},
                                              [&] { return flops(ref); }, c.budget());
  if (!shrunk.empty()) c.note("grouped_gemm: " + shrunk + " to fit the CPU budget of " + gflop(c.budget()) + " per call");
  std::string skipped;
  for (int64_t tokens : c.t.grouped_tokens) {
    if (c.budget() > 0 && flops(tokens) > c.budget()) {
      skipped.append(skipped.empty() ? "" : ",").append(std::to_string(tokens));  // append: GCC 12 -Wrestrict false positive on operator+
      continue;
    }
    const Timing tm = c.dev.grouped_gemm(int(experts), tokens, hidden, ffn);
    c.data.grouped.push_back({int(experts), tokens, hidden, ffn, tm.seconds});
    c.log("grouped_gemm experts=" + std::to_string(experts) + " tokens/expert=" + std::to_string(tokens) + ": " +
          std::to_string(tm.seconds * 1e3) + " ms");
  }
  if (!skipped.empty()) c.note("grouped_gemm: tokens per expert " + skipped + " over the CPU budget, not timed");
}

}  // namespace lcplan::profiler
