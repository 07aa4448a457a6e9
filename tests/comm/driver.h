// Shared helpers for the collective tests (nccl-tests style: one file per collective, one driver).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/comm/comm.h"

namespace lcplan::comm::tests {

// The world communicator for one test (freed at the end).
struct World {
  Comm c = world_mpi();
  ~World() { free_comm(c); }
};

// Runs f and returns the std::invalid_argument message it threw ("" when it did not throw).
inline std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Deterministic value for (rank, index) that is exact in bf16 (small integers).
inline float val(int rank, size_t i) { return static_cast<float>((rank * 7 + static_cast<int>(i) * 3) % 23 - 11); }

}  // namespace lcplan::comm::tests
