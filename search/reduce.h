// The reduced recipe (reference article, section 2.5): EP by model size, CP from a target local sequence,
// PP only when it pays, TP off unless needed; FSDP, full recompute, linear CE and chunked EP by default.
#pragma once

#include <string>
#include <vector>

#include "search/search.h"

namespace lcplan {

struct RecipeRules {
  double ep_size_threshold_params = 100e9;  // article: EP 8 for models <= 100B, 32 above
  int ep_small = 8, ep_large = 32;
  int64_t target_local_seq_max = 32768;     // article: keep per-GPU sequence around 16K-32K
  int ep_chunks = 2;                        // article: chunk2
  double pp_pays_fraction = 0.03;           // PP must beat PP=1 by this much throughput to be used
};

struct ReducedRecipe {
  bool found = false;                  // a plan following the rules (possibly bent) is valid and fits
  Candidate plan;
  std::vector<std::string> rationale;  // one line per choice
  std::vector<std::string> broken;     // rules that had to bend, or why the recipe loses to the search
  double throughput_gap = 0;           // (best - recipe) / best tokens/s; > 0 when the search found better
  double memory_delta_bytes = 0;       // recipe peak - best peak
};

ReducedRecipe reduce_recipe(const ModelSpec& m, const Plan& base, const Hardware& hw, const Calibration& cal,
                            const SearchOptions& opt, const SearchResult& exhaustive, const RecipeRules& rules = {});

}  // namespace lcplan
