// Device tensors of the GPU backend: DeviceBuf<T> is Buf<T> (tracking_allocator.h) on the device, charged to the
// same Tracker categories, so peaks per phase and their breakdowns come from the same code on both backends; and the
// driver's view of used memory for the cudaMemGetInfo cross-check (device_memory_check.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>

#include <cuda_runtime.h>

#include "executor/tracking_allocator.h"
#include "kernels/common/cuda_check.h"

namespace lcplan::exec::cuda {

struct DeviceFree {
  void operator()(void* p) const { CUDA_LOG(cudaFree(p)); }
};

// n elements of T in device memory, zero-initialised, charged to category c while alive. Move-only.
template <class T>
class DeviceBuf {
 public:
  DeviceBuf() = default;
  DeviceBuf(Tracker& t, Category c, size_t n) : n_(n) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    ptr_.reset(static_cast<T*>(p));  // owned before the next call can throw
    CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)));
    // cudaMemset runs on the legacy stream, which a non-blocking stream does not wait for: finish it here.
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    charge_ = Tracker::Charge(t, c, double(n) * sizeof(T));
  }
  T* data() { return ptr_.get(); }
  const T* data() const { return ptr_.get(); }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  void reset() {
    charge_.release();
    ptr_.reset();
    n_ = 0;
  }

 private:
  std::unique_ptr<T, DeviceFree> ptr_;
  size_t n_ = 0;
  Tracker::Charge charge_;
};

// Bytes of the current device in use now (total - free, cudaMemGetInfo): every process's, context included.
inline double device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b - free_b);
}

}  // namespace lcplan::exec::cuda
