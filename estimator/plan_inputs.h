// The inputs a plan names (model, hardware profile, calibration profile, implementation), loaded and checked once:
// the CLI, the Python module, lcplan-exec, calibrate/ and tune/ all start here, so a plan means the same thing and
// a bad name gets the same one sentence everywhere.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct PlanInputs {
  ModelSpec model;          // the plan's model with the plan's MTP module count applied
  Hardware hardware;        // the plan's hardware profile
  Calibration calibration;  // the profile resolved for the plan's hardware and implementation
  Calibration profile;      // the profile as loaded (bands, overrides for other hardware)
  std::vector<std::string> assumed;  // "field value" for each run setting the plan left to its implementation
};

// What a caller already holds instead of a name to load.
struct InputChoices {
  std::string calibration = "default";    // profile name or JSON path (ignored when `profile` is given)
  std::optional<ModelSpec> model;         // built from Megatron shape flags, or already loaded
  std::optional<Hardware> hardware;       // a hardware record given inline (Python dicts)
  std::optional<Calibration> profile;     // a calibration record given inline, or already loaded
  bool with_calibration = true;           // false: model and hardware only (a measured run's resolution)
  bool search = false;                    // unset performance switches take the framework's recommended values
};

// Loads what `plan` names from `data_dir` (zoo, data/hardware, data/calibration, or JSON paths), checks that the
// implementation is one the profile knows, and sets the run settings the plan left unset (Plan::assumed) to its
// implementation's defaults (estimator/frameworks.h resolve_run_defaults; the aux-loss routing imbalance from the
// calibration). Throws UserError, one sentence naming the value, for a name that cannot be loaded or looked up.
PlanInputs load_plan_inputs(Plan& plan, const std::string& data_dir, const InputChoices& choices = {});

// The checks a plan must pass on its inputs before it is estimated: a precision the hardware runs, what its
// framework runs (estimator/frameworks.h), then (unless `rules` is false: a search's base plan, whose free dimensions
// are not chosen yet) the plan rules (estimator/plan_rules.h). Throws UserError with the rule's sentence.
void check_plan_inputs(const PlanInputs& in, const Plan& plan, bool rules = true);

// load_plan_inputs, then check_plan_inputs: what every command that estimates a plan needs.
PlanInputs load_checked_inputs(Plan& plan, const std::string& data_dir, const InputChoices& choices = {});

// A model by zoo name or config.json path, with load_plan_inputs' one sentence for a name that cannot be looked up.
ModelSpec load_named_model(const std::string& name, const std::string& data_dir);

}  // namespace lcplan
