// GPU backend: the parameter store on the device. DeviceMem keeps every array in DeviceBuf (charged to the same
// Tracker categories as the host store) and does each touch as a stream-ordered call on one stream; the groups must
// be NCCL communicators on that same stream, so every collective and every local update run in program order.
#pragma once

#include <cuda_runtime.h>

#include "executor/device_buf_cuda.h"
#include "executor/param_store.h"

namespace lcplan::exec::cuda {

struct DeviceMem {
  template <class T>
  using Buffer = DeviceBuf<T>;
  cudaStream_t stream = nullptr;

  // Throws std::invalid_argument, before any CUDA call, unless c is an NCCL communicator on `stream`.
  void check(const comm::Comm& c) const;
  void zero(float* x, size_t n) const;
  void copy(const float* src, size_t n, float* dst) const;
  void copy(const bf16* src, size_t n, bf16* dst) const;
  void add(const float* x, size_t n, float* y) const;
  // Host to device, complete on return (the host vector may go).
  void upload(const std::vector<float>& h, float* d) const;
  void upload(const std::vector<bf16>& h, bf16* d) const;
  // fp64 per range on the device (sum_squares of ops_cuda.h), summed on the host in range order; synchronises.
  double sum_squares(const float* g, const Ranges& r) const;
  void adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n, const math::AdamScalars& a) const;
};

}  // namespace lcplan::exec::cuda

namespace lcplan::exec {
extern template class BasicParamStore<cuda::DeviceMem>;
// The device store: BasicParamStore's code on DeviceMem (param_store_cuda.cpp instantiates it).
using DeviceParamStore = BasicParamStore<cuda::DeviceMem>;
}  // namespace lcplan::exec
