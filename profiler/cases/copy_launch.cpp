// Case copy: a STREAM-like copy between two buffers of device memory (CPU: host memory) by size; gives
// time.hbm_efficiency (and the CPU profile's memory bandwidth). Case launch: host seconds to issue one kernel;
// gives time.launch_seconds.
#include "profiler/cases.h"

namespace lcplan::profiler {

void run_copy(CaseContext& c) {
  for (double bytes : c.t.copy_bytes) {
    const size_t b = size_t(bytes) / 16 * 16;
    const Timing tm = c.dev.copy(b);
    c.data.copy.push_back({double(b), tm.seconds});
    c.log("copy " + std::to_string(b) + " B: " + std::to_string(2 * double(b) / tm.seconds / 1e9) + " GB/s");
  }
}

void run_launch(CaseContext& c) {
  const Timing tm = c.dev.launch();
  c.data.launch.push_back({c.dev.launch_what(), tm.seconds});
  c.log("launch: " + std::to_string(tm.seconds * 1e6) + " us per " + c.dev.launch_what());
}

}  // namespace lcplan::profiler
