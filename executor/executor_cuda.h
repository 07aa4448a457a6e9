// lcplan-exec's step on GPUs: the step of step_impl.h (the one the CPU backend runs and its tests check) on
// DeviceBackend: the device layers (layers_cuda.h), the device parameter store on NCCL groups (param_store_cuda.h),
// a compute stream per rank and a send stream per outgoing pipeline link. A phase's time is read on the host clock after the stream has drained, so it is the device's
// time for the phase plus the host's launch gaps. Runs what device_support_error accepts.
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "executor/executor.h"

namespace lcplan::exec::cuda {

// Empty when the GPU backend runs this (already scaled) model and plan, else one sentence naming what the device
// layers lack (device_layer_support_error).
std::string device_support_error(const ModelSpec& m, const Plan& p);

// run_executor's contract on GPUs. `nccl_world` spans the ranks of `world` in the same order (comm::world_nccl on
// `stream`, each rank on its own device); `blas` is bound to `stream`. `world` (MPI) carries the host-side reports.
ExecResult run_executor(const comm::Comm& world, const comm::Comm& nccl_world, cudaStream_t stream,
                        cublasHandle_t blas, const ModelSpec& m, const Plan& p, const ExecOptions& o);

}  // namespace lcplan::exec::cuda
