// RAII device buffer and stream for the attention and linear-attention CUDA tests (fp32 tensors).
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/common/cuda_check.h"

namespace lcplan::test {

class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(float))); }
  explicit DeviceFloats(const std::vector<float>& host) : DeviceFloats(host.size()) {
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceFloats() { CUDA_LOG(cudaFree(ptr_)); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return ptr_; }
  std::vector<float> fetch() const {
    std::vector<float> out(n_);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  float* ptr_ = nullptr;
  size_t n_ = 0;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreate(&s_)); }
  ~Stream() { CUDA_LOG(cudaStreamDestroy(s_)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace lcplan::test
