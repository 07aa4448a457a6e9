// Variable-length batches (RL rollouts, packed SFT data): a distribution of sequence lengths, drawn into steps,
// balanced over DP ranks, packed into microbatches by a token budget (THD, each sequence attending only to itself)
// and estimated microbatch by microbatch: attention by each sequence's square, memory at the fullest microbatch,
// the step at the slowest DP rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/batch_spec.h"
#include "estimator/estimate.h"

namespace lcplan {

// One packed microbatch of one DP rank.
struct PackedMicrobatch {
  std::vector<int64_t> lengths;  // each padded to what CP / sequence parallelism needs, descending
  int64_t tokens = 0;            // their sum
  std::vector<int> splits{};     // hybrid CP's busiest-rank view only: the CP ranks each entry is split over
};

// Hybrid context parallelism (Megatron-LM --hybrid-context-parallel, its BalancedCPScheduler): each sequence of a CP
// group's microbatch runs on the fewest CP ranks, a power of two, that hold it within `budget` tokens per GPU, in the
// aligned group of that size whose busiest rank is least loaded (longest first). Returns the busiest rank's work as a
// regular CP microbatch: a sequence split over g of the cp ranks appears cp / g times, so the rank's tokens (sum L / g)
// and causal squares (sum L^2 / g) are what the estimator charges, and each split sequence's K/V ring runs over its g
// ranks (DerivedPlan::split_ring_tokens). Needs cp a power of two.
PackedMicrobatch hybrid_cp_busiest_rank(const PackedMicrobatch& mb, int cp, int64_t budget);

// The steps drawn with the options' seed: per step, per DP rank, its microbatches. Throws UserError when a sequence
// exceeds the budget times cp or the step has fewer sequences than DP ranks.
std::vector<std::vector<std::vector<PackedMicrobatch>>> draw_steps(const LengthDistribution& dist, const Plan& p,
                                                                  const PackingOptions& o);

// The plan of one microbatch: sequences of one length as micro_batch of seq_len (exactly the fixed-length plan),
// mixed lengths as one packed sequence (Plan::packed_lengths); `microbatches` per DP rank.
Plan microbatch_plan(const Plan& p, const PackedMicrobatch& packed, int microbatches);

struct BatchEstimate {
  int steps = 0;
  double step_mean = 0, step_p10 = 0, step_p90 = 0;  // the step (slowest DP rank) over the drawn steps (s)
  double rank_mean = 0;        // the mean DP rank's step, averaged over the drawn steps (s)
  double straggler_share = 0;  // (slowest rank - mean rank) / slowest rank, averaged over the drawn steps
  double tokens_per_second_per_gpu = 0;  // drawn (unpadded) tokens over the expected step
  double tflops_per_gpu = 0;             // model FLOPs (each sequence's own square) over the expected step
  double microbatches_mean = 0;          // per DP rank per step
  double peak_p99_bytes = 0, peak_max_bytes = 0;  // per-GPU peak at the 99th-percentile and the fullest microbatch
  double peak_p50_bytes = 0, peak_p90_bytes = 0;
  double tokens_p50 = 0, tokens_max = 0;           // tokens per microbatch
  struct Bin {
    double low = 0, high = 0;  // tokens per microbatch in [low, high)
    int count = 0;             // drawn microbatches
  };
  std::vector<Bin> token_histogram;  // 20 equal bins from 0 to the fullest microbatch
  PackedMicrobatch worst;  // the microbatch with the largest peak
  Plan worst_plan;         // its plan (microbatch_plan)
  Estimate worst_estimate;  // the full estimate at it (the memory table the search fits on)
  bool fits = false;        // the worst microbatch fits (its estimate's fits)
};

// `p` must be a valid plan for the model (its seq_len at least the distribution's longest padded sequence).
BatchEstimate estimate_batches(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal,
                               const LengthDistribution& dist, const PackingOptions& o);

nlohmann::json batch_estimate_to_json(const BatchEstimate& b);
std::string batch_estimate_table(const BatchEstimate& b, const LengthDistribution& dist, const PackingOptions& o);

// Tokens each sequence is padded to a multiple of: 2*cp*tp under CP (load-balanced causal chunks), tp under sequence
// parallelism, else 1 (the SeqDivisible rule, estimator/plan_rules.h).
int64_t sequence_multiple(const Plan& p);
// `length` padded up to that multiple: what a sequence occupies in a microbatch of plan `p`.
int64_t padded_length(int64_t length, const Plan& p);

}  // namespace lcplan
