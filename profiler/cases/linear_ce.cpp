// Case linear_ce: the loss layer forward + backward, linear CE (streamed vocabulary tiles, kernels/linear_ce) and
// the materialized-logits baseline at the same shape, by tokens, hidden, vocabulary and tile sizes; gives
// time.linear_ce_slowdown (linear / materialized).
#include "profiler/cases.h"

namespace lcplan::profiler {

void run_linear_ce(CaseContext& c) {
  if (c.t.ce_tokens.empty()) return;
  for (int64_t tokens0 : c.t.ce_tokens) {
    int64_t tokens = tokens0, vocab = c.t.ce_vocab, hidden = c.t.ce_hidden;
    int64_t largest_tile = 0;
    for (int64_t v : c.t.ce_vocab_tiles) largest_tile = std::max(largest_tile, v);
    // Forward + backward = 8 N H V FLOPs (kernels/linear_ce/linear_ce.h). The vocabulary first, keeping four tiles
    // so the streaming still streams; then hidden and tokens; then down to two tiles and fewer tokens.
    const std::string shrunk = shrink_to_budget(
        {{"vocab", &vocab, 4 * largest_tile, 0}, {"hidden", &hidden, 256, 1}, {"tokens", &tokens, 256, 1},
         {"vocab", &vocab, 2 * largest_tile, 2}, {"tokens", &tokens, 64, 3}},
        [&] { return 8.0 * double(tokens) * double(hidden) * double(vocab); }, c.budget());
    if (!shrunk.empty())
      c.note("linear_ce: " + shrunk + " to fit the CPU budget of " + gflop(c.budget()) + " per call");
    // The materialized baseline holds the fp32 logits and their gradient: fewer tokens until they fit in 4 GiB, so
    // both losses run at one shape.
    constexpr double kMaterializedLimit = 4.0 * (1u << 30);
    const int64_t before = tokens;
    while (double(tokens) * double(vocab) * 8 > kMaterializedLimit && tokens > 256) tokens /= 2;
    if (tokens != before)
      c.note("linear_ce: tokens " + std::to_string(before) + "->" + std::to_string(tokens) +
             " so the materialized logits and their gradient fit in 4 GiB");
    const double materialized_bytes = double(tokens) * double(vocab) * 8;
    for (int64_t tile : c.t.ce_vocab_tiles) {
      const int64_t vt = std::min(tile, vocab), tt = std::min(c.t.ce_token_tile, tokens);
      const Timing lin = c.dev.linear_ce(tokens, hidden, vocab, vt, tt, false);
      LinearCeRow row{tokens, hidden, vocab, vt, tt, c.dev.linear_ce_type(), lin.seconds, 0};
      if (materialized_bytes <= kMaterializedLimit) row.materialized_seconds = c.dev.linear_ce(tokens, hidden, vocab, vt, tt, true).seconds;
      else c.note("linear_ce: materialized baseline of " + std::to_string(tokens) + " x " + std::to_string(vocab) +
                  " logits skipped (over 4 GiB)");
      c.data.linear_ce.push_back(row);
      c.log("linear_ce tokens=" + std::to_string(tokens) + " vocab=" + std::to_string(vocab) + " tile=" + std::to_string(vt) +
            ": linear " + std::to_string(lin.seconds * 1e3) + " ms, materialized " +
            std::to_string(row.materialized_seconds * 1e3) + " ms");
    }
  }
}

}  // namespace lcplan::profiler
