// What lcplan-exec runs for a plan: the model shrunk by --scale K and --layers N, and the plan with its sequence
// shrunk to match. Tests, `lcplan-exec` and `lcplan validate` all call executor_case() / scale_model(), so the
// estimate that a measurement is compared with is computed for exactly the model and plan the executor ran.
// The rules are in executor/README.md ("Scale rules").
#pragma once

#include <string>
#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan::exec {

struct ScaleOptions {
  int factor = 1;           // --scale K (1 = full size)
  int layers_per_kind = 0;  // --layers N: the first N decoder layers of each kind, in model order (0 = every layer)
};

struct ScaledCase {
  ModelSpec model;             // what the executor builds (MTP modules dropped, see mtp_dropped)
  Plan plan;                   // seq_len divided, recompute_layers clamped to the kept layers
  ScaleOptions scale;
  std::vector<int> kept_layers;  // indices of the original decoder layers that were kept
  int mtp_dropped = 0;         // MTP modules of the original model the executor does not build
  std::vector<std::string> notes;  // one line per rule that changed something
};

// Throws UserError naming the bad value (factor < 1, layers < 0).
void check_scale_options(const ScaleOptions& s);

// The scaled model for a plan's parallel sizes (heads stay divisible by cp for gated DeltaNet, experts by ep).
// Drops MTP modules (lcplan-exec does not build them) and keeps the first N layers of each kind.
ModelSpec scale_model(const ModelSpec& m, const ScaleOptions& s, const Parallel& q, std::vector<std::string>* notes = nullptr,
                      std::vector<int>* kept = nullptr);
// The plan for the scaled model: seq_len / K rounded down to a multiple of 2*cp (at least 2*cp, load-balanced CP),
// recompute_layers clamped to the kept layer count; everything else unchanged.
Plan scale_plan(const Plan& p, const ModelSpec& scaled, const ScaleOptions& s, std::vector<std::string>* notes = nullptr);
ScaledCase executor_case(const ModelSpec& m, const Plan& p, const ScaleOptions& s);

// One sentence naming why lcplan-exec cannot run (model, plan) and what it can run, or "" when it can.
std::string executor_support_error(const ModelSpec& m, const Plan& p);

// The kind of a decoder layer as lcplan-exec names it ("linear_attention+moe", "full_attention+dense", "+sliding").
std::string layer_kind_name(const LayerSpec& l);

}  // namespace lcplan::exec
