// Checked CUDA / cuBLAS / NCCL / CUPTI calls: every runtime call reports file and line on failure.
// Only include from CUDA translation units (or code built when LCPLAN_HAVE_CUDA is set).
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace lcplan::gpu {

[[noreturn]] inline void fail(const char* what, const char* detail, const char* file, int line) {
  throw std::runtime_error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + detail);
}

// True when a CUDA device can actually be used (the return code is checked, not just the count:
// without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver and leaves the count untouched).
inline bool device_available() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    return false;
  }
  return n > 0;
}

// Destructors must not throw: they report a failed call (what, file, line, reason) on stderr and go on.
inline void log_failure(const char* what, const char* detail, const char* file, int line) {
  std::fprintf(stderr, "%s failed at %s:%d: %s\n", what, file, line, detail);
}

}  // namespace lcplan::gpu

#define CUDA_LOG(call)                                                                     \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess) ::lcplan::gpu::log_failure(#call, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_LOG(call)                                                                   \
  do {                                                                                     \
    auto st_ = (call);                                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::lcplan::gpu::log_failure(#call, ("cublas status " + std::to_string(static_cast<int>(st_))).c_str(), __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess) ::lcplan::gpu::fail(#call, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    auto st_ = (call);                                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::lcplan::gpu::fail(#call, ("cublas status " + std::to_string(static_cast<int>(st_))).c_str(), __FILE__, __LINE__); \
  } while (0)

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    auto st_ = (call);                                                                     \
    if (st_ != ncclSuccess) ::lcplan::gpu::fail(#call, ncclGetErrorString(st_), __FILE__, __LINE__); \
  } while (0)

#define CUPTI_CHECK(call)                                                                  \
  do {                                                                                     \
    auto st_ = (call);                                                                     \
    if (st_ != CUPTI_SUCCESS) {                                                            \
      const char* msg_ = nullptr;                                                          \
      cuptiGetResultString(st_, &msg_);                                                    \
      ::lcplan::gpu::fail(#call, msg_ ? msg_ : "unknown CUPTI error", __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)
