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

// How a DP rank's sequences become microbatches under a token budget.
enum class PackingPolicy : uint8_t {
  // First-fit decreasing into microbatches of at most the budget; each rank has as many as it needs.
  FirstFit,
  // RL trainers' dynamic batch size (verl rearrange_micro_batches): every DP rank gets the same count, the most any
  // rank's tokens need (ceil(tokens / budget), all-reduced with max; a multiple of pp under the interleaved
  // schedule), and its sequences are split into that many microbatches of balanced tokens (longest first to the
  // lightest), which may exceed the budget.
  Balanced,
};
const char* to_string(PackingPolicy p);

struct PackingOptions {
  // Tokens per GPU per microbatch (after CP); a microbatch holds about this times cp tokens, packed by `policy`.
  // 0: the plan's micro_batch sequences per microbatch, in the order drawn.
  int64_t tokens_per_microbatch = 0;
  PackingPolicy policy = PackingPolicy::FirstFit;
  int64_t global_tokens = 0;  // tokens per step (sequences drawn until reached); 0: the plan's global batch in sequences
  int samples = 16;           // steps drawn
  uint64_t seed = 1;
};

// A plan's batches: the lengths and their packing. Plan::batches holds one (shared, so plans copy cheaply).
struct BatchSpec {
  LengthDistribution lengths;
  PackingOptions packing;
};

// The recipe's "batches" object: {"seq_lengths": [[length, count], ...], "tokens_per_microbatch", "packing",
// "global_tokens", "samples", "seed"} (all but seq_lengths optional; "packing": "first_fit" or "balanced"). Bad input
// throws one UserError sentence.
PackingPolicy parse_packing_policy(const std::string& s, const std::string& what);
BatchSpec batch_spec_from_json(const nlohmann::json& j);
nlohmann::json batch_spec_to_json(const BatchSpec& b);

}  // namespace lcplan
