// The GPU backend's cross-check of its tracking allocator against the driver (cudaMemGetInfo): the bytes the
// Tracker holds live should be what the device's used memory grew by since the baseline (taken after the CUDA
// context, cuBLAS and NCCL were set up, so their own memory is not counted). The driver maps device memory in pages,
// so each live allocation may round up by up to one page; other processes on the same device also move the figure,
// which is why a mismatch is reported in the record's notes, not raised as an error. Pure, so it is tested on CPUs.
#pragma once

#include <cstdint>
#include <string>

namespace lcplan::exec {

// 2 MiB: the page size in which CUDA maps device memory on Hopper and Blackwell (cudaMemGetInfo moves in these
// steps; CUDA C++ Programming Guide, "Virtual Memory Management", cuMemGetAllocationGranularity).
constexpr double kDevicePageBytes = 2.0 * 1024 * 1024;

struct DeviceMemoryCheck {
  double tracked_bytes = 0;  // the Tracker's live bytes (the Buf/DeviceBuf allocations)
  double device_bytes = 0;   // used now - used at the baseline (used = total - free)
  double allowance = 0;      // page rounding the allocations may add: (live allocations + 1) pages
  bool consistent = false;   // tracked - 1 page <= device <= tracked + allowance
  std::string note;          // one sentence for the measurement record
};

// Throws std::invalid_argument naming a negative or non-finite input.
DeviceMemoryCheck check_device_memory(double tracked_bytes, double used_now, double used_at_baseline,
                                      int64_t live_allocations, double page_bytes = kDevicePageBytes);

}  // namespace lcplan::exec
