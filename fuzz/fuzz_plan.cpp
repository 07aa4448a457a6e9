// Fuzz target: recipe.json -> Plan. Valid or UserError; an accepted plan survives a JSON round trip unchanged,
// and the plan rules judge it (against a small zoo model) without crashing.
#include <cstdint>

#include "estimator/plan.h"
#include "estimator/plan_rules.h"
#include "fuzz/fuzz_util.h"
#include "common/data_dir.h"
#include "common/user_error.h"
#include "models/zoo.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  static const ModelSpec model = load_model("qwen3.5-35b-a3b", data_dir());
  const auto j = fuzz::parse_json(data, size);
  if (!j) return 0;
  Plan p;
  try {
    p = plan_from_json(*j);
  } catch (const UserError&) {
    return 0;
  }
  const auto rule = check_plan(model, p);
  if (!rule) {
    // Round trip: what we write back (recipe.json emitted by search) must read back as the same plan.
    const nlohmann::json once = plan_to_json(p);
    Plan again;
    try {
      again = plan_from_json(once);
    } catch (const UserError&) {
      fuzz::require(false, "plan_to_json output of a valid plan is accepted by plan_from_json");
    }
    fuzz::require(plan_to_json(again) == once, "plan JSON round trip is stable");
  }
  return 0;
}
