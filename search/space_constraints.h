// Restricting the plan space: a dimension given one value is pinned, a list restricts it, an absent one stays free.
// Shared by `lcplan search` (flags) and the Python module (keyword arguments), which differ only in how a value is
// named in an error ("--tp" or "tp").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "search/plan_space.h"

namespace lcplan {

struct SpaceConstraints {
  std::optional<std::vector<int>> tp, pp, vpp, cp, ep, etp, micro_batch, ep_chunks, recompute_layers;
  std::optional<std::vector<OptimizerSharding>> sharding;
  std::optional<std::vector<Recompute>> recompute;
  std::optional<std::vector<bool>> linear_ce, offload_optimizer;
};

// The default space (default_space) with every given dimension replaced by its values. Each value of a parallel
// size is checked alone against the plan rules first, so that a pin that cannot work gets its own sentence:
// "<prefix>tp 3 cannot work: ..." (prefix "--" for flags, "" for keyword arguments).
PlanSpace constrained_space(const ModelSpec& m, const Plan& base, const SpaceConstraints& c, const std::string& prefix);

}  // namespace lcplan
