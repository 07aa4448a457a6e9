// The search over variable-length batches (--seq-lengths): the token budget, CP size and the rest of the layout that
// maximize expected tokens/s over the drawn batches while the fullest microbatch fits.
#pragma once

#include <cstdint>
#include <vector>

#include "estimator/packing.h"
#include "search/reduce.h"
#include "search/search.h"

namespace lcplan {

struct BatchCandidate {
  Plan plan;                      // the run's plan with its batches (micro batch 1, packed by tokens_per_microbatch)
  int64_t tokens_per_microbatch = 0;
  BatchEstimate batches;          // over the drawn steps
};

struct BatchSearchResult {
  std::vector<BatchCandidate> top;  // by expected tokens/s per GPU, best first
  size_t searches = 0;              // (cp, budget) pairs searched
  size_t candidates = 0, feasible = 0;  // plans enumerated and fitting over those searches
  double seconds = 0;
};

// Speed/quality knobs of the search (bench/search BM_BatchSearchKnobs records what each costs and whether the chosen
// plan changes; bench/results.json "batch_search_knobs").
struct BatchSearchKnobs {
  int rerank_per_search = 5;  // best plans of each (cp, budget) fixed-length search estimated over drawn batches
  int ranking_samples = 2;    // steps drawn to rank them (the options' --samples estimate the plans shown)
};

// For each CP size of `space` and each token budget (the options' budget, or 1, 2 and 4 times the least that holds the
// longest sequence), the fixed-length search ranks layouts by the fullest microbatch a drawn step packs (memory at the
// maximum); its best plans are then estimated over the drawn batches and ranked by expected tokens/s. `base` gives
// the fixed fields (its global batch in sequences, or the options' global tokens).
BatchSearchResult search_batches(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                                 const Calibration& cal, const SearchOptions& opt, const LengthDistribution& dist,
                                 const PackingOptions& packing, const BatchSearchKnobs& knobs = {});

// The reduced recipe over batches: the article's rules (search/reduce.h) with the local-sequence rule read as local
// tokens per microbatch: CP so that the longest sequence's share is within the rule's target, then microbatches of
// the target's tokens per GPU (at least the longest sequence's share), estimated over the drawn batches.
struct BatchRecipe {
  bool found = false;            // the rule plan is valid and its fullest microbatch fits
  BatchCandidate plan;
  ReducedRecipe rules;           // the fixed-length recipe at the longest sequence: its rationale and bends
  std::vector<std::string> broken;  // beyond rules.broken: why it does not fit, or what it loses to the search
  double throughput_gap = 0;     // (best - recipe) / best expected tokens/s over the search's best
};
BatchRecipe reduce_batch_recipe(const ModelSpec& m, const Plan& base, const Hardware& hw, const Calibration& cal,
                                const SearchOptions& opt, const LengthDistribution& dist, const PackingOptions& packing,
                                const BatchSearchResult& searched, const RecipeRules& rules = {});

std::string batch_search_table(const BatchSearchResult& r, int rows);
std::string batch_recipe_text(const BatchRecipe& r);
nlohmann::json batch_search_json(const BatchSearchResult& r, const BatchRecipe* recipe = nullptr);

}  // namespace lcplan
