// RAII CUPTI activity tracer (compiled only with CUDA): kernel, memcpy and memset records with their device start
// and end per stream, the ground truth of GPU timing in `lcplan profile`. Every CUPTI call is checked (CUPTI_CHECK).
// Records become ActivityBuffers; all arithmetic on them is in activity.h (pure, tested without a GPU).
#pragma once

#include <cuda_runtime.h>
#include <cupti.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "profiler/activity.h"

namespace lcplan::profiler {

// Tags::On also records which tag (push_tag) each launch was made under (activity.h time_by_tag): CUPTI then
// traces every runtime and driver API call, which costs host time per launch, so profiling leaves it off.
enum class Tags { Off, On };

class CuptiTracer {
 public:
  // Registers the buffer callbacks and enables CONCURRENT_KERNEL, MEMCPY and MEMSET activity for this process
  // (with Tags::On also EXTERNAL_CORRELATION, RUNTIME and DRIVER). Throws std::runtime_error when another tracer is
  // live or a CUPTI call fails.
  explicit CuptiTracer(size_t buffer_bytes = size_t(8) << 20, Tags tags = Tags::Off);
  // Flushes, disables the activity kinds and releases the process-wide slot (failures are logged, not thrown).
  ~CuptiTracer();
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  // Forces CUPTI to hand over every buffer (call after the traced work finished, e.g. cudaStreamSynchronize) and
  // returns the buffers completed since the last take. Throws when a callback failed.
  std::vector<ActivityBuffer> take();
  // CUPTI's id of a stream (what ActivityRecord::stream holds for work on it).
  uint32_t stream_id(cudaStream_t s) const;
  // Launches this thread makes until the matching pop_tag() are attributed to `tag` (a stack: the innermost tag
  // wins). Throws std::logic_error without Tags::On, and std::runtime_error when CUPTI refuses (pop of an empty stack).
  void push_tag(uint64_t tag);
  void pop_tag();

 private:
  static void CUPTIAPI on_request(uint8_t** buffer, size_t* size, size_t* max_records);
  static void CUPTIAPI on_complete(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid);
  // Converts one completed buffer and queues it with its drop count (and the first error, if any).
  void complete(uint8_t* buffer, size_t valid, size_t dropped, std::string err);

  // Why process-wide: cuptiActivityRegisterCallbacks takes plain C function pointers without a user argument, and
  // CUPTI collects activity per process, so the callbacks can find their tracer only through one process-wide slot.
  // The constructor claims it (a second live tracer is refused) and the destructor releases it; it is a class member
  // so nothing outside the tracer can touch it.
  static std::atomic<CuptiTracer*> live_;

  size_t buffer_bytes_;
  std::vector<CUpti_ActivityKind> kinds_;  // enabled by the constructor, disabled by the destructor
  bool tags_on_ = false;                   // built with Tags::On (push_tag / pop_tag allowed)
  std::mutex mu_;
  std::vector<ActivityBuffer> done_;  // guarded by mu_ (CUPTI calls on_complete from its own thread)
  std::string error_;                 // first failure inside a callback (callbacks must not throw into CUPTI)
};

}  // namespace lcplan::profiler
