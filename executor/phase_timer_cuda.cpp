#include "executor/phase_timer_cuda.h"

#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"

namespace lcplan::exec::cuda {

namespace {
const char* phase_name(int p) { return to_string(static_cast<Phase>(p)); }
}  // namespace

PhaseTimer::~PhaseTimer() {
  for (Pair& p : pairs_) {
    if (p.start) CUDA_LOG(cudaEventDestroy(p.start));
    if (p.stop) CUDA_LOG(cudaEventDestroy(p.stop));
  }
}

void PhaseTimer::begin(Phase p) {
  if (open_ >= 0)
    throw std::logic_error(std::string("phase timer: ") + phase_name(int(p)) + " begun while " + phase_name(open_) +
                           " is still open");
  Pair b;
  b.phase = int(p);
  try {
    CUDA_CHECK(cudaEventCreate(&b.start));
    CUDA_CHECK(cudaEventCreate(&b.stop));
    CUDA_CHECK(cudaEventRecord(b.start, stream_));
  } catch (...) {  // a pair that failed to start is not kept: seconds() reads only complete pairs
    if (b.start) CUDA_LOG(cudaEventDestroy(b.start));
    if (b.stop) CUDA_LOG(cudaEventDestroy(b.stop));
    throw;
  }
  pairs_.push_back(b);
  open_ = int(p);
}

void PhaseTimer::end(Phase p) {
  if (open_ != int(p))
    throw std::logic_error(std::string("phase timer: ") + phase_name(int(p)) + " ended but " +
                           (open_ < 0 ? std::string("no phase") : std::string(phase_name(open_))) + " is open");
  CUDA_CHECK(cudaEventRecord(pairs_.back().stop, stream_));
  open_ = -1;
}

std::array<double, kPhases> PhaseTimer::seconds() const {
  if (open_ >= 0) throw std::logic_error(std::string("phase timer: ") + phase_name(open_) + " is still open");
  std::array<double, kPhases> s{};
  if (pairs_.empty()) return s;
  CUDA_CHECK(cudaEventSynchronize(pairs_.back().stop));
  for (const Pair& p : pairs_) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
    s[size_t(p.phase)] += double(ms) * 1e-3;
  }
  return s;
}

}  // namespace lcplan::exec::cuda
