// The measurement record lcplan-exec writes (calibrate/measurement.h with its optional detail).
#pragma once

#include <string>

#include "calibrate/measurement.h"
#include "executor/executor.h"
#include "executor/scale.h"

namespace lcplan::exec {

// Peak = the largest phase peak over ranks; its rank's breakdown. Phases: the peak rank's peak per phase with its
// breakdown and the slowest rank's wall seconds per step. step_seconds: the median over steps after the first
// (the first when there is one step).
Measurement measurement_record(const ScaledCase& sc, const ExecOptions& o, const ExecResult& r,
                               const std::string& host);

// "Linux 6.8.0 x86_64, <CPU model>, N logical CPUs".
std::string host_description();

}  // namespace lcplan::exec
