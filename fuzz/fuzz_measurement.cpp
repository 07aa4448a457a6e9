// Fuzz target: measurements JSON (array or {"measurements": [...]}) -> Measurement records. Valid or UserError;
// accepted records carry only positive finite measured values (none at all only for a run that ran out of memory). Models/hardware are not resolved (that reads files).
#include <cstdint>

#include "calibrate/measurement.h"
#include "fuzz/fuzz_util.h"
#include "common/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const auto j = fuzz::parse_json(data, size);
  if (!j) return 0;
  std::vector<Measurement> ms;
  try {
    ms = measurements_from_json(*j, "fuzz");
  } catch (const UserError&) {
    return 0;
  }
  fuzz::require(!ms.empty(), "an accepted measurements file holds at least one record");
  for (const auto& m : ms) {
    fuzz::require(m.peak_bytes || m.step_seconds || m.tflops_per_gpu || m.status == MeasurementStatus::OutOfMemory,
                  "every record has a measured value, or says the run did not fit");
    for (const auto& v : {m.peak_bytes, m.step_seconds, m.tflops_per_gpu})
      if (v) fuzz::require(fuzz::finite_nonneg(*v) && *v > 0, "measured values are positive and finite");
    // The executor's optional detail: byte values finite and non-negative, and the record written back reads the same.
    if (m.breakdown) fuzz::require(fuzz::finite_nonneg(m.breakdown->total()), "breakdown bytes are finite and >= 0");
    for (const auto& ph : m.phases)
      if (ph && ph->breakdown) fuzz::require(fuzz::finite_nonneg(ph->breakdown->total()), "phase bytes are finite and >= 0");
    const nlohmann::json back = measurement_to_json(m);
    Measurement again;
    try {
      again = measurement_from_json(back, "fuzz round trip");
    } catch (const UserError&) {
      fuzz::require(false, "a record lcplan writes back is accepted");
    }
    fuzz::require(measurement_to_json(again) == back, "a record written back reads the same");
  }
  return 0;
}
