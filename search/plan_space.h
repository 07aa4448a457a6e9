// The plan space the search walks: every dimension a list of values; flags pin or restrict dimensions.
#pragma once

#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct PlanSpace {
  std::vector<int> tp, pp, vpp, cp, ep, etp, micro_batch, ep_chunks;
  std::vector<OptimizerSharding> sharding;
  std::vector<Recompute> recompute;
  // Full recompute only: explicit layer counts per virtual stage (0 = all) when pinned, else these fractions of
  // the layers of a virtual stage (1 = all).
  std::vector<int> recompute_layers;
  std::vector<double> recompute_fractions;
  std::vector<bool> linear_ce, offload_optimizer;

  size_t size() const;  // candidate count before any rule is checked
};

// Every dimension free: powers of two bounded by the model (heads, experts, layers) and the GPU count.
PlanSpace default_space(const ModelSpec& m, const Plan& base);

}  // namespace lcplan
