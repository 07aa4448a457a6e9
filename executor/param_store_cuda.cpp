#include "executor/param_store_cuda.h"

#include <memory>
#include <stdexcept>
#include <vector>

#include "executor/ops_cuda.h"
#include "executor/param_store_impl.h"
#include "kernels/common/cuda_check.h"

namespace lcplan::exec {

namespace cuda {

void DeviceMem::check(const comm::Comm& c) const {
  if (c.backend != comm::Backend::Nccl)
    throw std::invalid_argument("a device parameter store needs NCCL process groups (comm::world_nccl), got an MPI "
                                "communicator");
  if (static_cast<cudaStream_t>(c.stream) != stream)
    throw std::invalid_argument("a device parameter store's NCCL groups must run on its own stream, so that "
                                "collectives and local updates stay in order");
}

void DeviceMem::zero(float* x, size_t n) const {
  if (n) CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream));
}
void DeviceMem::copy(const float* src, size_t n, float* dst) const {
  if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}
void DeviceMem::copy(const bf16* src, size_t n, bf16* dst) const {
  if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
}
void DeviceMem::add(const float* x, size_t n, float* y) const { add_inplace(x, y, n, stream); }

void DeviceMem::upload(const std::vector<float>& h, float* d) const {
  if (h.empty()) return;
  CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // h is pageable and may be freed on return
}
void DeviceMem::upload(const std::vector<bf16>& h, bf16* d) const {
  if (h.empty()) return;
  CUDA_CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

double DeviceMem::sum_squares(const float* g, const Ranges& r) const {
  if (r.empty()) return 0;
  void* raw = nullptr;
  CUDA_CHECK(cudaMalloc(&raw, r.size() * sizeof(double)));
  std::unique_ptr<double, DeviceFree> partial(static_cast<double*>(raw));
  for (size_t k = 0; k < r.size(); ++k)
    cuda::sum_squares(g + r[k].first, r[k].second - r[k].first, partial.get() + k, stream);
  std::vector<double> h(r.size());
  CUDA_CHECK(cudaMemcpyAsync(h.data(), partial.get(), h.size() * sizeof(double), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  double s = 0;
  for (double v : h) s += v;
  return s;
}

void DeviceMem::adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n,
                     const math::AdamScalars& a) const {
  cuda::adam(g, m, v, master, p, n, a, stream);
}

}  // namespace cuda

template class BasicParamStore<cuda::DeviceMem>;

}  // namespace lcplan::exec
