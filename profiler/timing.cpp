#include "profiler/timing.h"

#include <algorithm>
#include <chrono>

#include "profiler/fit.h"

namespace lcplan::profiler {

Timing summarize(const std::vector<double>& seconds) {
  Timing t;
  if (seconds.empty()) return t;
  t.seconds = median(seconds);
  t.min = *std::min_element(seconds.begin(), seconds.end());
  t.max = *std::max_element(seconds.begin(), seconds.end());
  t.repeats = int(seconds.size());
  return t;
}

std::vector<double> slowest_rank(const comm::Comm& sync, std::vector<double> seconds) {
  if (sync.size > 1 && !seconds.empty())
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), int(seconds.size()), MPI_DOUBLE, MPI_MAX, sync.mpi));
  return seconds;
}

Timing time_repeats(const comm::Comm& sync, const RepeatOptions& o, const std::function<void()>& body, int inner) {
  for (int i = 0; i < o.warmup; ++i) body();
  std::vector<double> s;
  s.reserve(size_t(o.repeats));
  for (int i = 0; i < o.repeats; ++i) {
    if (sync.size > 1) MPI_CHECK(MPI_Barrier(sync.mpi));
    const auto t0 = std::chrono::steady_clock::now();
    body();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(1, inner));
  }
  return summarize(slowest_rank(sync, std::move(s)));
}

}  // namespace lcplan::profiler
