#include "executor/executor_cuda.h"

#include "executor/device_memory_check.h"
#include "executor/layers_cuda.h"
#include "executor/param_store_cuda.h"
#include "executor/phase_timer_cuda.h"
#include "executor/step_impl.h"
#include "kernels/common/cuda_check.h"

namespace lcplan::exec::cuda {

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

  comm::ProcessGroups groups(const comm::Comm&, const RankLayout& l) const {
    return comm::make_process_groups(nccl_world, l);
  }
  // Every DeviceBuf of the step is stream-ordered on the compute stream (device_buf_cuda.h).
  void attach(Tracker& t) const { t.set_device_stream(stream); }
  // Outgoing pipeline links send on streams of their own (one per direction), incoming ones receive on the compute
  // stream: a send waiting for its receiver holds neither this rank's work nor its other link (comm/groups.h).
  comm::PipeLinks pipe_links(const comm::Comm& pp) {
    if (pp.size > 1 && !produced) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&send_fwd, cudaStreamNonBlocking));
      CUDA_CHECK(cudaStreamCreateWithFlags(&send_bwd, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    }
    return comm::make_pipe_links(pp, stream, send_fwd, send_bwd);
  }
  // The send streams start after the work queued so far on the compute stream (which wrote the message).
  void before_send() const {
    CUDA_CHECK(cudaEventRecord(produced, stream));
    CUDA_CHECK(cudaStreamWaitEvent(send_fwd, produced, 0));
    CUDA_CHECK(cudaStreamWaitEvent(send_bwd, produced, 0));
  }
  // The receive is queued on the compute stream; waiting for it here times the bubble as the host backend's does.
  void after_recv() const { CUDA_CHECK(cudaStreamSynchronize(stream)); }
  DeviceMem mem() const { return DeviceMem{stream}; }
  DeviceOps ops(Tracker& t) const { return DeviceOps{t, blas, stream, moe_comm}; }
  // A copy from the host vector in the compute stream's order (the buffer is stream-ordered there), complete on
  // return, before the vector goes.
  DeviceBuf<int64_t> ids(Tracker& t, const std::vector<int64_t>& v) const {
    DeviceBuf<int64_t> b(t, Category::Workspace, v.size());
    if (!v.empty()) {
      CUDA_CHECK(cudaMemcpyAsync(b.data(), v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    return b;
  }
  // CUDA events on the compute stream around each phase (PhaseTimer): the device's own time for it.
  void phase_begin(Phase ph) { timer.begin(ph); }
  // After each phase: the stream drained, the tracker's live bytes against the growth of the device's used memory
  // since the backend was made (device_memory_check.h); the first disagreement is kept for the record.
  void phase_end(const Tracker& t, Phase ph) {
    timer.end(ph);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (!note.empty()) return;
    const DeviceMemoryCheck m = check_device_memory(t.live_total(), device_used_bytes(), baseline, t.live_charges());
    if (!m.consistent) note = m.note;
  }
  std::array<double, kPhases> device_phase_seconds() const { return timer.seconds(); }
  std::string name() const { return "cuda"; }
  std::string device() const {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return prop.name;
  }
  std::vector<std::string> notes() const { return note.empty() ? std::vector<std::string>{} : std::vector{note}; }

  double baseline = 0;  // the device's used bytes after the context, cuBLAS and NCCL, before the step's first buffer
  std::string note;
  cudaStream_t send_fwd = nullptr, send_bwd = nullptr;  // the outgoing pipeline links' streams (pp > 1)
  cudaEvent_t produced = nullptr;
  // The MoE layers' all-to-alls run here (moe_ops_cuda.cpp run_steps), at the device's highest priority so a ready
  // all-to-all is not queued behind the compute stream's GEMMs.
  cudaStream_t moe_comm = nullptr;
  PhaseTimer timer{stream};

  ~DeviceBackend() {
    if (produced) CUDA_LOG(cudaEventDestroy(produced));
    for (cudaStream_t s : {send_fwd, send_bwd, moe_comm})
      if (s) CUDA_LOG(cudaStreamDestroy(s));
  }
};

}  // namespace

ExecResult run_executor(const comm::Comm& world, const comm::Comm& nccl_world, cudaStream_t stream,
                        cublasHandle_t blas, const ModelSpec& m, const Plan& p, const ExecOptions& o) {
  if (nccl_world.backend != comm::Backend::Nccl || nccl_world.size != world.size)
    throw std::invalid_argument("the GPU step needs an NCCL world over the same ranks as the MPI world");
  DeviceBackend be{nccl_world, stream, blas, device_used_bytes(), ""};
  int lo = 0, hi = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CUDA_CHECK(cudaStreamCreateWithPriority(&be.moe_comm, cudaStreamNonBlocking, hi));
  return step_detail::Step<DeviceBackend>::run(world, m, p, o, be);
}

}  // namespace lcplan::exec::cuda
