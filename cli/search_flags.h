// Search flags shared by `lcplan search` and `lcplan report --search`, and the search they set up: base plan from
// the plan flags, the space they restrict, the options, the exhaustive search (with a progress line on a terminal)
// and the reduced recipe.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/batch_flags.h"
#include "cli/plan_flags.h"
#include "search/batch_search.h"
#include "search/reduce.h"
#include "search/search.h"
#include "search/space_constraints.h"

namespace lcplan::cli {

struct SearchFlags {
  std::string headroom = "4", objective = "throughput", floor, top = "10";
};

void add_search_flags(CLI::App* cmd, SearchFlags& f);
// Names of the search flags given (not at their defaults), for commands that accept them only with --search.
std::vector<std::string> given_search_flags(const SearchFlags& f);

// What a search walks and with which inputs, from the flags (before any plan is estimated).
struct SearchSetup {
  StartingPoint start;  // for its warnings
  Plan base;
  bool global_batch_defaulted = false;  // the base plan's global batch is the default (one sequence per GPU)
  Inputs in;
  SearchOptions options;
  nlohmann::json space_request;  // the dimension flags given (search/space_constraints.h), as tune records them
  PlanSpace space;
};
// Throws UserError for bad flags.
SearchSetup prepare_search(const PlanFlags& plan, const SearchFlags& flags);

struct SearchRun {
  Plan base;
  bool global_batch_defaulted = false;
  Inputs in;
  SearchOptions options;
  SearchResult result;
  ReducedRecipe recipe;
};

// Throws UserError for bad flags, and with explain_infeasible's sentence when nothing fits.
SearchRun run_search(const PlanFlags& plan, const SearchFlags& flags);

// search --seq-lengths (and report --search --seq-lengths): the layouts and token budgets that maximize expected
// tokens/s over the batches drawn from `dist`, each kept plan fitting its fullest microbatch.
struct BatchSearchRun {
  SearchSetup setup;
  PackingOptions packing;  // as the flags gave it (a candidate's budget is its own)
  BatchSearchResult result;
  BatchRecipe recipe;  // the reduced recipe over the same batches
};
BatchSearchRun run_batch_search(const PlanFlags& plan, const SearchFlags& flags, const BatchFlags& batches,
                                const LengthDistribution& dist);

}  // namespace lcplan::cli
