// Presenting search results: terminal table, JSON record (Megatron-LM flags: search/megatron_flags.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "search/reduce.h"
#include "search/search.h"

namespace lcplan {

std::string search_table(const SearchResult& r, const ReducedRecipe& recipe, bool explain_rejects, int pareto_rows);
nlohmann::json search_json(const SearchResult& r, const ReducedRecipe& recipe);
// One short line naming a plan's layout and options ("tp 1 pp 1 cp 2 ep 4 mb 1 fsdp full lce chunks 2").
std::string plan_label(const Plan& p);

}  // namespace lcplan
