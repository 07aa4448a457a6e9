// GPU tests under mpirun: whether every rank can run (one usable device per rank on each node: NCCL cannot put two
// ranks on one GPU), decided collectively so every rank skips together, and each rank's device by node-local rank.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <string>

#include "kernels/common/cuda_check.h"
#include "kernels/comm/comm.h"

namespace lcplan::test {

// Empty when every rank can run; otherwise the reason, identical on every rank. Collective over MPI_COMM_WORLD.
inline std::string gpu_skip_reason() {
  int ok = lcplan::gpu::device_available() ? 1 : 0;
  int devices = 0;
  if (ok) CUDA_CHECK(cudaGetDeviceCount(&devices));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0;
  MPI_CHECK(MPI_Comm_size(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  int enough = ok && devices >= local ? 1 : 0;
  int flags[2] = {ok, enough};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!flags[0]) return "no usable CUDA device on some rank";
  if (!flags[1]) return "fewer CUDA devices than ranks on a node (NCCL needs one GPU per rank)";
  return "";
}

// cudaSetDevice(node-local rank modulo the node's devices).
inline void pick_device() {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0;
  MPI_CHECK(MPI_Comm_rank(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  CUDA_CHECK(cudaSetDevice(local % n));
}

}  // namespace lcplan::test
