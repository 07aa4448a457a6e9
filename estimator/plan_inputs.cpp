#include "estimator/plan_inputs.h"

#include <cctype>
#include <filesystem>

#include "common/user_error.h"
#include "estimator/derived_plan.h"
#include "estimator/frameworks.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"

namespace lcplan {

namespace {

// Runs `load` for a name the user gave; a filesystem error while looking it up (a name too long to be a file name,
// a path through a file) is the user's input, not a bug, and becomes one sentence naming the value.
template <typename F>
auto looked_up(const char* what, const std::string& name, F load) {
  try {
    return load();
  } catch (const std::filesystem::filesystem_error& e) {
    std::string why = e.code().message();
    if (!why.empty()) why[0] = char(std::tolower(static_cast<unsigned char>(why[0])));
    throw UserError(std::string(what) + " \"" + name + "\" cannot be looked up (" + why +
                    "; give a name from the zoo or data/ folder, or the path of a JSON file)");
  }
}

}  // namespace

ModelSpec load_named_model(const std::string& name, const std::string& data_dir) {
  return looked_up("model", name, [&] { return load_model(name, data_dir); });
}

PlanInputs load_plan_inputs(Plan& plan, const std::string& dir, const InputChoices& c) {
  PlanInputs in;
  in.model = c.model ? model_for_plan(*c.model, plan)
                     : looked_up("model", plan.model, [&] { return model_for_plan(load_model(plan.model, dir), plan); });
  in.hardware = c.hardware ? *c.hardware : looked_up("hardware", plan.hardware, [&] { return load_hardware(plan.hardware, dir); });
  plan.gpus_per_node = nvlink_domain_gpus(plan, in.hardware);
  const auto profile = [&] {
    return c.profile ? *c.profile : looked_up("calibration", c.calibration, [&] { return load_calibration(c.calibration, dir); });
  };
  if (c.with_calibration) {
    in.profile = profile();
    require_known_implementation(in.profile, plan.implementation);
    in.calibration = calibration_for(in.profile, in.hardware, plan.implementation);
    in.assumed = resolve_run_defaults(plan, in.model, in.calibration, c.search);
  } else if (plan.assumed) {
    // A measured run's plan: its calibration is resolved later, its unset settings from the profile named here.
    in.assumed = resolve_run_defaults(plan, in.model, calibration_for(profile(), in.hardware, plan.implementation), c.search);
  }
  return in;
}

void check_plan_inputs(const PlanInputs& in, const Plan& plan, bool rules) {
  if (const std::string e = precision_support_error(in.hardware, plan.precision); !e.empty()) throw UserError(e);
  if (const std::string e = framework_support_error(in.model, plan); !e.empty()) throw UserError(e);
  if (rules) require_valid_plan(in.model, plan);
}

PlanInputs load_checked_inputs(Plan& plan, const std::string& dir, const InputChoices& c) {
  PlanInputs in = load_plan_inputs(plan, dir, c);
  check_plan_inputs(in, plan);
  return in;
}

}  // namespace lcplan
