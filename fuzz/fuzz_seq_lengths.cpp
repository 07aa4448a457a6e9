// Fuzz target: sequence-length files (--seq-lengths: lines, JSON lists, [length, count] histograms) and the packing
// of an accepted distribution. Valid or UserError; an accepted distribution is ascending, positive and packs every
// drawn sequence once within the budget.
#include <cstdint>
#include <string>

#include "common/user_error.h"
#include "estimator/packing.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const std::string text(reinterpret_cast<const char*>(data), size);
  LengthDistribution d;
  try {
    d = parse_seq_lengths(text, "lengths.txt");
  } catch (const UserError&) {
    return 0;
  }
  fuzz::require(!d.lengths.empty() && d.lengths.size() == d.weights.size(), "a distribution has lengths and weights");
  for (size_t i = 0; i < d.lengths.size(); ++i) {
    fuzz::require(d.lengths[i] >= 1 && d.weights[i] > 0, "lengths and weights are positive");
    fuzz::require(i == 0 || d.lengths[i] > d.lengths[i - 1], "lengths are distinct and ascending");
  }
  fuzz::require(d.mean_length() >= double(d.lengths.front()) * (1 - 1e-12) &&
                    d.mean_length() <= double(d.lengths.back()) * (1 + 1e-12),
                "the mean lies between the shortest and the longest length");
  Plan p;
  p.model = "toy";
  p.gpus = 4;
  p.parallel.cp = 2;
  p.global_batch = 8;
  PackingOptions o;
  o.samples = 1;
  o.seed = size;
  const int64_t mult = sequence_multiple(p);
  o.tokens_per_microbatch = ((d.max_length() + mult - 1) / mult * mult + 1) / 2 + (size % 3) * 1024;
  try {
    const auto steps = draw_steps(d, p, o);
    int sequences = 0;
    for (const auto& rank : steps.at(0))
      for (const auto& mb : rank) {
        fuzz::require(mb.tokens <= o.tokens_per_microbatch * p.parallel.cp, "a microbatch keeps its budget");
        sequences += int(mb.lengths.size());
      }
    fuzz::require(sequences == 8, "every drawn sequence is packed once");
  } catch (const UserError&) {
  }
  return 0;
}
