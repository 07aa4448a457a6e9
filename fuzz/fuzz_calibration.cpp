// Fuzz target: calibration JSON -> Calibration. Valid or UserError; an accepted profile has every coefficient
// finite and non-negative and survives a JSON round trip.
#include <cstdint>

#include "estimator/calibration.h"
#include "fuzz/fuzz_util.h"
#include "common/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const auto j = fuzz::parse_json(data, size);
  if (!j) return 0;
  Calibration c;
  try {
    c = calibration_from_json(*j, "fuzz");
  } catch (const UserError&) {
    return 0;
  }
  for (const auto& info : coefficient_table())
    fuzz::require(fuzz::finite_nonneg(c.*(info.member)), "accepted coefficients are finite and non-negative");
  Calibration again;
  try {
    again = calibration_from_json(calibration_to_json(c), "fuzz");
  } catch (const UserError&) {
    fuzz::require(false, "calibration_to_json output is accepted by calibration_from_json");
  }
  for (const auto& info : coefficient_table())
    fuzz::require(again.*(info.member) == c.*(info.member), "calibration JSON round trip keeps every value");
  return 0;
}
