#include "executor/device_memory_check.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace lcplan::exec {

namespace {

void require(const char* name, double v) {
  if (!std::isfinite(v) || v < 0)
    throw std::invalid_argument(std::string("device memory check: ") + name + " = " + std::to_string(v) +
                                " must be a finite number of bytes >= 0");
}

std::string mib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024.0));
  return s;
}

}  // namespace

DeviceMemoryCheck check_device_memory(double tracked_bytes, double used_now, double used_at_baseline,
                                      int64_t live_allocations, double page_bytes) {
  require("tracked bytes", tracked_bytes);
  require("used bytes now", used_now);
  require("used bytes at the baseline", used_at_baseline);
  require("live allocations", double(live_allocations));
  require("page bytes", page_bytes);
  DeviceMemoryCheck c;
  c.tracked_bytes = tracked_bytes;
  c.device_bytes = used_now - used_at_baseline;
  c.allowance = double(live_allocations + 1) * page_bytes;
  c.consistent = c.device_bytes >= tracked_bytes - page_bytes && c.device_bytes <= tracked_bytes + c.allowance;
  c.note = "device memory: the tracker holds " + mib(c.tracked_bytes) + ", cudaMemGetInfo's used memory grew by " +
           mib(c.device_bytes) +
           (c.consistent ? " (consistent within page rounding of " + mib(c.allowance) + ")"
                         : " (differs by more than page rounding of " + mib(c.allowance) +
                               ": another process on the device, or memory the tracker does not see)");
  return c;
}

}  // namespace lcplan::exec
