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
  std::string packing;                // --packing first_fit|balanced
  std::string global_tokens;         // --global-tokens N
  std::string samples, seed;
  bool beyond_max_position = false;  // the run extends positions past the model's max_position (YaRN, RoPE scaling)
};

void add_batch_flags(CLI::App* cmd, BatchFlags& f);

// The distribution of --seq-lengths, or none. It stands in for --seq (giving both is an error): the plan's flags get
// its longest length so the starting plan has a sequence length.
std::optional<LengthDistribution> read_batch_lengths(const BatchFlags& f, PlanFlags& plan_flags);

// After the starting point: the plan's batches from --seq-lengths and the packing flags, or the recipe's own
// ("batches", the packing flags overriding its packing). False when the plan has none (then a packing flag is an
// error). Checks the lengths against the model, sets seq_len to the longest padded sequence.
bool prepare_batches(const BatchFlags& f, const std::optional<LengthDistribution>& dist, const ModelSpec& m, Plan& plan);

// estimate and report over a plan's batches (prepare_batches true): checks the plan's rules, packs and estimates its
// batches; the record is the fullest microbatch's estimate record with "batches" added and the plan's own record.
struct BatchRecord {
  BatchEstimate batches;
  nlohmann::json record;
};
BatchRecord estimate_batch_record(const PlanInputs& in, const Plan& plan);

}  // namespace lcplan::cli
