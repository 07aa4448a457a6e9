// Helpers shared by the comm and MoE tests and the MoE proxies: an owned MPI world communicator, the message of
// an expected std::invalid_argument, and (in builds that see the CUDA runtime) an owned fp32 device buffer.
#pragma once

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/comm/comm.h"

namespace lcplan::helpers {

// A duplicate of MPI_COMM_WORLD for one test or program, freed at scope exit (a failed free is logged).
struct World {
  comm::Comm c = comm::world_mpi();
  World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    try {
      comm::free_comm(c);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "World: %s\n", e.what());
    }
  }
};

// main() of an MPI program: MPI_Init, body(rank), MPI_Finalize; any exception (input mistakes included) is reported
// as one line naming the program and the rank, on every rank that throws, and gives exit status 1.
inline int mpi_main(int argc, char** argv, const char* program, const std::function<int(int rank)>& body) {
  int rank = 0, rc = 0;
  bool initialized = false;
  try {
    MPI_CHECK(MPI_Init(&argc, &argv));
    initialized = true;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    rc = body(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error (rank %d): %s\n", program, rank, e.what());
    rc = 1;
  }
  try {
    if (initialized) MPI_CHECK(MPI_Finalize());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error (rank %d): %s\n", program, rank, e.what());
    rc = 1;
  }
  return rc;
}

// Runs f and returns the std::invalid_argument message it threw ("" when it did not throw).
inline std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace lcplan::helpers

// The CUDA runtime is on the include path exactly when the target links it (CUDA builds).
#if __has_include(<cuda_runtime.h>)
#include "kernels/common/cuda_check.h"

namespace lcplan::helpers {

// n floats on the current device (at least one is allocated so the pointer is never null).
struct DevF {
  float* p = nullptr;
  size_t n = 0;
  explicit DevF(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(float))); }
  explicit DevF(const std::vector<float>& h) : DevF(h.size()) {
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  DevF(const DevF&) = delete;
  DevF& operator=(const DevF&) = delete;
  ~DevF() { CUDA_LOG(cudaFree(p)); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace lcplan::helpers
#endif
