// Host-side timing shared by the backends: warm-up, repeats after a barrier, slowest rank per repeat, median.
#pragma once

#include <functional>
#include <vector>

#include "kernels/comm/comm.h"
#include "profiler/device.h"

namespace lcplan::profiler {

// Median, min and max of per-repeat seconds (already the slowest rank's).
Timing summarize(const std::vector<double>& seconds);

// Max-reduces per-repeat seconds over every rank of `sync` in one all-reduce, so each entry is the slowest rank's.
std::vector<double> slowest_rank(const comm::Comm& sync, std::vector<double> seconds);

// Runs `body` o.warmup times, then o.repeats times timed by the steady clock, each repeat after a barrier of `sync`;
// returns the summary of the slowest rank's times divided by `inner` (calls of the timed thing per body).
Timing time_repeats(const comm::Comm& sync, const RepeatOptions& o, const std::function<void()>& body, int inner = 1);

}  // namespace lcplan::profiler
