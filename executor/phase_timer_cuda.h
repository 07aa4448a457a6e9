// Per-phase GPU time of the GPU backend from CUDA events: begin(phase) and end(phase) record an event pair on the
// stream, and seconds() sums each phase's pairs (cudaEventElapsedTime) once the last event has completed. This is
// the time the stream spent between the marks, communication waits included, as a training framework's per-phase
// timers report it; kernel-only time per phase comes from the CUPTI tracer (profiler/cupti_tracer.h).
#pragma once

#include <array>
#include <vector>

#include <cuda_runtime.h>

#include "estimator/memory_model.h"
#include "executor/tracking_allocator.h"

namespace lcplan::exec::cuda {

class PhaseTimer {
 public:
  explicit PhaseTimer(cudaStream_t stream) : stream_(stream) {}
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // Throws std::logic_error (before any CUDA call) when a phase is begun while another is open, or ended without
  // being begun: a mismatched mark would silently swap two phases' times.
  void begin(Phase p);
  void end(Phase p);
  bool open() const { return open_ >= 0; }
  // Seconds per phase (lcplan::Phase order) summed over every closed pair; synchronises on the last event. Throws
  // std::logic_error while a phase is open.
  std::array<double, kPhases> seconds() const;

 private:
  struct Pair {
    int phase = 0;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  cudaStream_t stream_ = nullptr;
  std::vector<Pair> pairs_;
  int open_ = -1;
};

}  // namespace lcplan::exec::cuda
