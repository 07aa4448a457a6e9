#include "executor/executor_cuda.h"

#include "executor/device_memory_check.h"
#include "executor/layers_cuda.h"
#include "executor/param_store_cuda.h"
#include "executor/step_impl.h"
#include "kernels/common/cuda_check.h"

namespace lcplan::exec::cuda {

std::string device_support_error(const ModelSpec& m, const Plan& p) {
  if (p.parallel.pp > 1)
    return "the GPU backend runs pp = 1 only (pp = " + std::to_string(p.parallel.pp) +
           ": pipeline parallelism runs on --backend cpu)";
  return device_layer_support_error(m.layers, p.linear_ce);
}

namespace {

// The GPU backend of the step (step_impl.h).
struct DeviceBackend {
  template <class T>
  using Buf = DeviceBuf<T>;
  using Ops = DeviceOps;
  using Store = DeviceParamStore;
  const comm::Comm& nccl_world;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;

  std::string support_error(const ModelSpec& m, const Plan& p) const { return device_support_error(m, p); }
  comm::ProcessGroups groups(const comm::Comm&, const RankLayout& l) const {
    return comm::make_process_groups(nccl_world, l);
  }
  DeviceMem mem() const { return DeviceMem{stream}; }
  DeviceOps ops(Tracker& t) const { return DeviceOps{t, blas, stream}; }
  // A synchronous copy from the host vector: complete on return, before the vector goes.
  DeviceBuf<int64_t> ids(Tracker& t, const std::vector<int64_t>& v) const {
    DeviceBuf<int64_t> b(t, Category::Workspace, v.size());
    if (!v.empty()) CUDA_CHECK(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    return b;
  }
  // After each phase: the stream drained, the tracker's live bytes against the growth of the device's used memory
  // since the backend was made (device_memory_check.h); the first disagreement is kept for the record.
  void phase_end(const Tracker& t) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (!note.empty()) return;
    const DeviceMemoryCheck m = check_device_memory(t.live_total(), device_used_bytes(), baseline, t.live_charges());
    if (!m.consistent) note = m.note;
  }
  std::vector<std::string> notes() const { return note.empty() ? std::vector<std::string>{} : std::vector{note}; }

  double baseline = 0;  // the device's used bytes after the context, cuBLAS and NCCL, before the step's first buffer
  std::string note;
};

}  // namespace

ExecResult run_executor(const comm::Comm& world, const comm::Comm& nccl_world, cudaStream_t stream,
                        cublasHandle_t blas, const ModelSpec& m, const Plan& p, const ExecOptions& o) {
  if (nccl_world.backend != comm::Backend::Nccl || nccl_world.size != world.size)
    throw std::invalid_argument("the GPU step needs an NCCL world over the same ranks as the MPI world");
  DeviceBackend be{nccl_world, stream, blas, device_used_bytes(), ""};
  return step_detail::Step<DeviceBackend>::run(world, m, p, o, be);
}

}  // namespace lcplan::exec::cuda
