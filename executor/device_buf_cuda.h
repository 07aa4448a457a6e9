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

// Frees in the order of `stream` when set (stream-ordered pool: no device-wide synchronisation, which would stall the
// host behind a pipeline send another rank has not yet received), else with cudaFree.
struct DeviceFree {
  cudaStream_t stream = nullptr;
  bool ordered = false;
  void operator()(void* p) const {
    if (ordered) {
      CUDA_LOG(cudaFreeAsync(p, stream));
    } else {
      CUDA_LOG(cudaFree(p));
    }
  }
};

// n elements of T in device memory, zero-initialised, charged to category c while alive. Move-only. With the
// tracker's device stream set, allocation, zeroing and freeing are stream-ordered on it (cudaMallocAsync from the
// device's default pool, which caches freed blocks until the next synchronisation: a caching allocator, with no
// cudaMalloc and no synchronisation per tensor), and the buffer may be used on that stream only (or after an event on
// it); without one, cudaMalloc and a completed memset.
template <class T>
class DeviceBuf {
 public:
  DeviceBuf() = default;
  DeviceBuf(Tracker& t, Category c, size_t n) : n_(n) {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
    void* p = nullptr;
    if (void* s = t.device_stream()) {
      const auto st = static_cast<cudaStream_t>(s);
      CUDA_CHECK(cudaMallocAsync(&p, bytes, st));
      ptr_ = std::unique_ptr<T, DeviceFree>(static_cast<T*>(p), DeviceFree{st, true});  // owned before a throw
      CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, st));
    } else {
      CUDA_CHECK(cudaMalloc(&p, bytes));
      ptr_.reset(static_cast<T*>(p));
      CUDA_CHECK(cudaMemset(p, 0, bytes));
      // cudaMemset runs on the legacy stream, which a non-blocking stream does not wait for: finish it here.
      CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    }
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

// Bytes of the current device in use now (total - free, cudaMemGetInfo): every process's, context included. First
// returns the blocks the default pool caches (stream-ordered frees already done) to the driver, so the figure is the
// live allocations; call it after the streams that free into the pool have drained.
inline double device_used_bytes() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaMemPool_t pool = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b - free_b);
}

}  // namespace lcplan::exec::cuda
