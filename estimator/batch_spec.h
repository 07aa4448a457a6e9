// What a plan says about variable-length batches (RL rollouts, packed SFT data): the distribution of sequence
// lengths and how they are drawn and packed into microbatches (estimator/packing.h estimates them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lcplan {

// A histogram of sequence lengths: distinct lengths ascending, each with its count (or weight).
struct LengthDistribution {
  std::vector<int64_t> lengths;
  std::vector<double> weights;
  int64_t max_length() const { return lengths.empty() ? 0 : lengths.back(); }
  double mean_length() const;
};

// A sequence-length file: one length per line ('#' starts a comment), a JSON list of lengths, or a JSON list of
// [length, count] pairs. Bad input throws one UserError sentence naming `source`, the value and what is valid.
LengthDistribution parse_seq_lengths(const std::string& text, const std::string& source);
LengthDistribution read_seq_lengths_file(const std::string& path);

struct PackingOptions {
  // Tokens per GPU per microbatch (after CP); a microbatch holds up to this times cp tokens, packed first-fit
  // decreasing. 0: the plan's micro_batch sequences per microbatch, in the order drawn.
  int64_t tokens_per_microbatch = 0;
  int64_t global_tokens = 0;  // tokens per step (sequences drawn until reached); 0: the plan's global batch in sequences
  int samples = 16;           // steps drawn
  uint64_t seed = 1;
};

// A plan's batches: the lengths and their packing. Plan::batches holds one (shared, so plans copy cheaply).
struct BatchSpec {
  LengthDistribution lengths;
  PackingOptions packing;
};

// The recipe's "batches" object: {"seq_lengths": [[length, count], ...], "tokens_per_microbatch", "global_tokens",
// "samples", "seed"} (the last four optional). Bad input throws one UserError sentence.
BatchSpec batch_spec_from_json(const nlohmann::json& j);
nlohmann::json batch_spec_to_json(const BatchSpec& b);

}  // namespace lcplan
