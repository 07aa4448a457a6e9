// `lcplan validate` (cli/cmd_validate_run.cpp) on the record the reference run wrote (fixture executor_reference_run):
// the record is for the recipe scaled as recorded, the peak and every category of the measured peak phase within 5%
// of the estimate with the executor's profile, time per phase beside its estimate, and a record for another recipe is
// refused in one sentence.
#include <gtest/gtest.h>

#include <cmath>

#include "cli/commands.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {
namespace {

const std::string kPlan = std::string(LCPLAN_SOURCE_DIR) + "/tests/executor/plans/reference.json";
const std::string kMeasured = LCPLAN_MEASURED_FILE;

TEST(Validate, ReferenceRunAgreesWithItsEstimate) {
  ValidateRunArgs a;
  a.plan = kPlan;
  a.measured = kMeasured;
  a.json = true;
  const nlohmann::json all = nlohmann::json::parse(validate_run(a, LCPLAN_SOURCE_DIR));
  ASSERT_EQ(all.size(), 1u);
  const nlohmann::json& j = all[0];
  EXPECT_EQ(j.at("implementation"), "lcplan-exec");
  const double est = j.at("peak").at("estimate"), meas = j.at("peak").at("measured");
  EXPECT_LT(std::abs(meas / est - 1), 0.05) << j.dump(2);
  const std::string phase = j.at("peak").at("measured_phase");
  for (const auto& [cat, row] : j.at("phases").at(phase).at("breakdown").items()) {
    const double e = row.at("estimate"), m = row.at("measured");
    if (std::max(e, m) < 4096) continue;
    EXPECT_LT(std::abs(m / e - 1), 0.05) << cat << "\n" << j.dump(2);
  }
  // Time per phase: the estimate's phases add up to its step, and each has the run's seconds beside it.
  const nlohmann::json& t = j.at("time");
  double sum = 0;
  for (const char* ph : {"forward", "loss", "backward", "optimizer"}) {
    const nlohmann::json& row = t.at("phases").at(ph);
    EXPECT_GT(row.at("estimate").get<double>(), 0) << ph;
    EXPECT_GT(row.at("measured").get<double>(), 0) << ph;
    sum += row.at("estimate").get<double>();
  }
  EXPECT_NEAR(sum, t.at("estimate_step_seconds").get<double>(), 1e-9 * sum);
  a.json = false;
  const std::string text = validate_run(a, LCPLAN_SOURCE_DIR);
  EXPECT_NE(text.find("moe_buffers"), std::string::npos) << text;
  for (const char* row : {"time (s/step)", "  forward ", "  loss ", "  backward ", "  optimizer ", "  step "})
    EXPECT_NE(text.find(row), std::string::npos) << row << "\n" << text;
  // On the CPU profile the device note goes away (the run's device is the profile's).
  a.hardware = "cpu-amd-epyc-2c";
  a.calibration = "cpu-measured";
  const std::string cpu = validate_run(a, LCPLAN_SOURCE_DIR);
  EXPECT_EQ(cpu.find("note: time:"), std::string::npos) << cpu;
}

TEST(Validate, ARecordOfAnotherPlanIsRefused) {
  nlohmann::json plan = read_json_file(kPlan, "plan");
  plan["seq_len"] = 65536;
  const std::string other = std::string(LCPLAN_BINARY_DIR) + "/other_plan.json";
  write_file_atomic(other, plan.dump());
  ValidateRunArgs a;
  a.plan = other;
  a.measured = kMeasured;
  try {
    validate_run(a, LCPLAN_SOURCE_DIR);
    FAIL() << "accepted a record of a different plan";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("different plan"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lcplan
