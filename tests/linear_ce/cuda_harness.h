// Device-side test harness for the CUDA linear CE tests: RAII device buffers and cuBLAS/stream context, device copies
// of one problem, and run_cuda (forward + backward, outputs decoded to fp32 on the host).
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/linear_ce/linear_ce_cuda.h"
#include "tests/linear_ce/reference.h"

namespace lcplan::linear_ce::test {

// One device allocation, freed on every path out of a test (an exception included).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, const void* src = nullptr) : bytes_(bytes) {
    CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)));  // cudaMalloc(0) may return null: keep a real pointer
    if (src != nullptr && bytes > 0) CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }  // destructor: nothing useful to do on failure
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::vector<char> fetch() const {
    std::vector<char> out(bytes_);
    if (bytes_ > 0) CUDA_CHECK(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A cuBLAS handle and a stream, released with the scope.
class CudaContext {
 public:
  CudaContext() {
    CUBLAS_CHECK(cublasCreate(&handle));
    CUDA_CHECK(cudaStreamCreate(&stream));
  }
  ~CudaContext() {
    (void)cublasDestroy(handle);
    (void)cudaStreamDestroy(stream);
  }
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

inline const float kOne = 1.0f;

// Device copies of one problem: d supplies hidden, targets and upstream grads, `weight` the p.vocab weight rows
// (host memory, d's dtype); outputs and workspace are allocated to size.
struct DeviceProblem {
  DeviceProblem(const Data& d, const Options& o, const Problem& p, const void* weight)
      : dtype(d.dtype),
        none(o.reduction == Reduction::None),
        ws_bytes(cuda::workspace_bytes(p, d.dtype, o)),
        hidden(d.n * d.h * dtype_bytes(d.dtype), d.hidden()),
        w(p.vocab * d.h * dtype_bytes(d.dtype), weight),
        targets(d.n * sizeof(int64_t), d.targets.data()),
        grad((none ? d.n : 1) * sizeof(float), none ? d.grad.data() : &kOne),
        loss((none ? d.n : 1) * sizeof(float)),
        lse(d.n * sizeof(float)),
        dh(d.n * d.h * dtype_bytes(d.dtype)),
        dw(p.vocab * d.h * dtype_bytes(d.dtype)),
        ws(ws_bytes) {}

  // Waits for the stream and decodes the outputs.
  Outputs outputs() const {
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    Outputs out;
    out.loss = decode(loss.fetch(), DType::F32);
    out.lse = decode(lse.fetch(), DType::F32);
    out.dh = decode(dh.fetch(), dtype);
    out.dw = decode(dw.fetch(), dtype);
    return out;
  }

  DType dtype;
  bool none;
  size_t ws_bytes;
  DeviceBuffer hidden, w, targets, grad, loss, lse, dh, dw, ws;
  CudaContext ctx;
};

// Forward + backward of problem `p` through cuda::forward / cuda::backward (with `all_reduce` when given).
inline Outputs run_cuda(const Data& d, const Options& o, const Problem& p, const void* weight,
                        const cuda::DeviceAllReduce& all_reduce = {}) {
  const DeviceProblem x(d, o, p, weight);
  cuda::forward(x.ctx.handle, p, d.dtype, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(), x.loss.as<float>(),
                x.lse.as<float>(), o, all_reduce, x.ws.as(), x.ws_bytes, x.ctx.stream);
  cuda::backward(x.ctx.handle, p, d.dtype, x.hidden.as(), x.w.as(), x.targets.as<int64_t>(), x.lse.as<float>(),
                 x.grad.as<float>(), x.dh.as(), x.dw.as(), o, all_reduce, x.ws.as(), x.ws_bytes, x.ctx.stream);
  return x.outputs();
}

inline Outputs run_cuda(const Data& d, const Options& o) { return run_cuda(d, o, d.problem(), d.weight()); }

}  // namespace lcplan::linear_ce::test
