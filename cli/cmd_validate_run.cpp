// `lcplan validate --plan recipe.json --measured measured.json`: the estimate of the model and plan a measurement
// ran (lcplan-exec's --scale / --layers replayed through executor/scale.h) next to what was measured, per memory
// category and per phase. `lcplan validate` (cli/cmd_validate.cpp) calls it when --measured is given.
#include <cstdio>
#include <string>

#include "calibrate/measurement.h"
#include "calibrate/validate_run.h"
#include "cli/commands.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "executor/scale.h"
#include "models/zoo.h"

namespace lcplan {

std::string validate_run(const ValidateRunArgs& a, const std::string& data_dir) {
  const Plan recipe = load_plan_file(a.plan);
  const std::vector<Measurement> ms = load_measurements(a.measured);
  const ModelSpec full = load_model(recipe.model, data_dir);
  nlohmann::json all = nlohmann::json::array();
  std::string text;
  for (const Measurement& meas : ms) {
    exec::ScaleOptions so;
    if (meas.scale) so = {meas.scale->factor, meas.scale->layers_per_kind};
    exec::ScaledCase sc = exec::executor_case(full, recipe, so);
    // The record must be for this recipe: same plan after scaling (the executor's profile name aside).
    nlohmann::json want = plan_to_json(sc.plan), got = plan_to_json(meas.plan);
    want.erase("implementation");
    got.erase("implementation");
    if (want != got)
      throw UserError("measurement \"" + meas.id + "\" is for a different plan than " + a.plan +
                      " scaled by " + std::to_string(so.factor) + " (recorded " + got.dump() + ", expected " +
                      want.dump() + ")");
    const std::string impl = a.implementation.empty() ? meas.plan.implementation : a.implementation;
    const Calibration profile = load_calibration(a.calibration.empty() ? "default" : a.calibration, data_dir);
    require_known_implementation(profile, impl);
    const Hardware hw = load_hardware(a.hardware.empty() ? meas.plan.hardware : a.hardware, data_dir);
    const Calibration cal = calibration_for(profile, hw, impl);
    const Comparison c = compare(sc.model, meas.plan, hw, cal, meas);
    if (a.json) {
      nlohmann::json j = comparison_to_json(c);
      j["id"] = meas.id;
      j["implementation"] = impl;
      all.push_back(j);
    } else {
      text += "measurement " + meas.id + " (implementation " + impl + ", model " + sc.model.name + ")\n" +
              comparison_table(c) + "\n";
    }
  }
  return a.json ? all.dump(2) + "\n" : text;
}

}  // namespace lcplan
