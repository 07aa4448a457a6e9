// Restricting the plan space: the user's values for the dimensions the search walks, parsed in one place for
// `lcplan search` and `lcplan tune` (flags; tune records the request in its log) and the Python module (keyword
// arguments). A dimension given one value is pinned, a list restricts it, an absent one stays free.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "search/plan_space.h"

namespace lcplan {

// The request parsed: per dimension, its values (absent: free).
struct SpaceConstraints {
  std::optional<std::vector<int>> tp, pp, vpp, cp, ep, etp, micro_batch, ep_chunks, recompute_layers;
  std::optional<std::vector<OptimizerSharding>> sharding;
  std::optional<std::vector<Recompute>> recompute;
  std::optional<std::vector<bool>> linear_ce, offload_optimizer;
};

enum class DimensionKind {
  Count,      // whole numbers of at least `least`
  Sharding,   // none, dist_opt, fsdp
  Recompute,  // none, selective, full
  Switch,     // true / false
};

// One dimension a user may pin or restrict.
struct SpaceDimension {
  const char* key;   // keyword argument and request key ("micro_batch")
  const char* flag;  // the CLI flag ("--micro-batch")
  DimensionKind kind;
  int least = 1;     // Count: the smallest valid value
  // Where the values go: Count and Switch dimensions (Sharding and Recompute have one member each).
  std::optional<std::vector<int>> SpaceConstraints::*counts = nullptr;
  std::optional<std::vector<bool>> SpaceConstraints::*switches = nullptr;
};
// Every such dimension, in PlanSpace order.
const std::vector<SpaceDimension>& space_dimensions();

// How errors name a dimension: by its flag ("--tp 3 cannot work: ...") or its key ("tp 3 cannot work: ...").
enum class Naming { Flags, Keywords };

// The user's values by dimension key, a JSON object (what `lcplan tune` records as its request's "space"): one value
// or an array of them. Count: whole numbers; Sharding, Recompute: names, where a string may hold a comma list
// ("fsdp,dist_opt", as a flag gives it); Switch: true or false. Throws UserError, one sentence naming the dimension
// and what is valid.
SpaceConstraints parse_space_request(const nlohmann::json& request, Naming naming);

// The space the search walks: the default space (default_space) with every given dimension replaced by its values,
// and `base` set to each given dimension's first value (what `estimate` would take). Each value of a parallel size
// is checked alone against the plan rules first, so that a pin that cannot work gets its own sentence:
// "--tp 3 cannot work: ..." (Naming::Flags) or "tp 3 cannot work: ..." (Naming::Keywords).
PlanSpace search_space(const ModelSpec& m, Plan& base, const SpaceConstraints& c, Naming naming);

}  // namespace lcplan
