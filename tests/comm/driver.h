// Shared helpers for the collective tests (nccl-tests style: one file per collective, one driver).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/comm/comm.h"
#include "kernels/comm/helpers.h"

namespace lcplan::comm::tests {

using helpers::invalid_argument_of;
using helpers::World;

// Deterministic value for (rank, index) that is exact in bf16 (small integers).
inline float val(int rank, size_t i) { return static_cast<float>((rank * 7 + static_cast<int>(i) * 3) % 23 - 11); }

}  // namespace lcplan::comm::tests
