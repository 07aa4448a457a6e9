// The shipped default profile on H100, as tests of zoo models read it: the calibration a plan's implementation gets.
#pragma once

#include "common/data_dir.h"
#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"

namespace lcplan::testing {

struct ZooProfile {
  Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  Calibration profile = load_calibration("default", data_dir());
  Calibration cal(const Plan& p) const { return calibration_for(profile, hw.name, p.implementation); }
};

}  // namespace lcplan::testing
