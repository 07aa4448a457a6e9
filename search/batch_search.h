// The search over variable-length batches (--seq-lengths): the token budget, CP size and the rest of the layout that
// maximize expected tokens/s over the drawn batches while the fullest microbatch fits.
#pragma once

#include <cstdint>
#include <vector>

#include "estimator/packing.h"
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

// For each CP size of `space` and each token budget (the options' budget, or 1, 2 and 4 times the least that holds the
// longest sequence), the fixed-length search ranks layouts by the fullest microbatch a drawn step packs (memory at the
// maximum); its best plans are then estimated over the drawn batches and ranked by expected tokens/s. `base` gives
// the fixed fields (its global batch in sequences, or the options' global tokens).
BatchSearchResult search_batches(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                                 const Calibration& cal, const SearchOptions& opt, const LengthDistribution& dist,
                                 const PackingOptions& packing);

std::string batch_search_table(const BatchSearchResult& r, int rows);
nlohmann::json batch_search_json(const BatchSearchResult& r);

}  // namespace lcplan
