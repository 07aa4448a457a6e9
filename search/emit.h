// Presenting search results: terminal table, JSON record (Megatron-LM flags: search/megatron_flags.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "search/reduce.h"
#include "search/search.h"

namespace lcplan {

// The search's table: the best plans under `objective`, the Pareto front (the chosen plan, both ends and evenly
// spaced points between, at most `pareto_rows` rows plus the chosen plan; how many were left out is said) and the
// reduced recipe.
std::string search_table(const SearchResult& r, const ReducedRecipe& recipe, bool explain_rejects, int pareto_rows,
                         Objective objective = Objective::Throughput);

// The front's rows a table shows: both ends, `rows` evenly spaced points between, and `chosen` (an index into the
// front, or npos), ascending and without repeats.
std::vector<size_t> pareto_rows_shown(size_t front_size, size_t rows, size_t chosen);
nlohmann::json search_json(const SearchResult& r, const ReducedRecipe& recipe);
// One short line naming a plan's layout and options ("tp 1 pp 1 cp 2 ep 4 mb 1 fsdp full lce chunks 2").
std::string plan_label(const Plan& p);

}  // namespace lcplan
