// Flags of variable-length batches (--seq-lengths and its packing), shared by the commands that take them.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/plan_flags.h"
#include "estimator/packing.h"

namespace lcplan::cli {

struct BatchFlags {
  std::string seq_lengths;           // --seq-lengths FILE
  std::string tokens_per_microbatch;  // --tokens-per-microbatch N (per GPU, after CP)
  std::string global_tokens;         // --global-tokens N
  std::string samples, seed;
  bool beyond_max_position = false;  // the run extends positions past the model's max_position (YaRN, RoPE scaling)
};

void add_batch_flags(CLI::App* cmd, BatchFlags& f);

// The distribution of --seq-lengths, or none. It stands in for --seq (giving both is an error): the plan's flags get
// its longest length so the starting plan has a sequence length.
std::optional<LengthDistribution> read_batch_lengths(const BatchFlags& f, PlanFlags& plan_flags);

// Checks the distribution against the model and the plan, sets the plan's seq_len to the longest padded sequence and
// returns the packing options. Bad input throws one UserError sentence.
PackingOptions prepare_batches(const BatchFlags& f, const LengthDistribution& dist, const ModelSpec& m, Plan& plan);

// estimate and report over --seq-lengths: packs and estimates the plan's batches (prepare_batches, then the plan's
// rules); the record is the fullest microbatch's estimate record with "batches" added.
struct BatchRecord {
  PackingOptions packing;
  BatchEstimate batches;
  nlohmann::json record;
};
BatchRecord estimate_batch_record(const BatchFlags& f, const LengthDistribution& dist, const PlanInputs& in, Plan& plan);

}  // namespace lcplan::cli
