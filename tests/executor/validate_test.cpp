// `lcplan validate` (cli/cmd_validate_run.cpp) on the record the reference run wrote (fixture executor_reference_run):
// the record is for the recipe scaled as recorded, the peak and every category of the measured peak phase within 5%
// of the estimate with the executor's profile, and a record for another recipe is refused in one sentence.
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
  a.json = false;
  const std::string text = validate_run(a, LCPLAN_SOURCE_DIR);
  EXPECT_NE(text.find("moe_buffers"), std::string::npos) << text;
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
