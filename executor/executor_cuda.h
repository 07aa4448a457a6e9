// lcplan-exec's step on GPUs: the step of step_impl.h (the one the CPU backend runs and its tests check) on
// DeviceBackend: the device layers (layers_cuda.h), the device parameter store on NCCL groups (param_store_cuda.h),
// a compute stream per rank and a send stream per outgoing pipeline link. A phase's time is read on the host clock after the stream has drained, so it is the device's
// time for the phase plus the host's launch gaps. Runs every model and plan the CPU backend runs
// (executor_support_error decides for both).
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "executor/executor.h"

namespace lcplan::exec::cuda {

// run_executor's contract on GPUs. `nccl_world` spans the ranks of `world` in the same order (comm::world_nccl on
// `stream`, each rank on its own device); `blas` is bound to `stream`. `world` (MPI) carries the host-side reports.
ExecResult run_executor(const comm::Comm& world, const comm::Comm& nccl_world, cudaStream_t stream,
                        cublasHandle_t blas, const ModelSpec& m, const Plan& p, const ExecOptions& o);

}  // namespace lcplan::exec::cuda
