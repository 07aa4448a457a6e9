// Vocabulary parallelism on GPUs: the CUDA launchers' cross-rank hook bound to lcplan::comm all-reduces.
#include "kernels/linear_ce/linear_ce_vocab_parallel_cuda.h"

#include <exception>
#include <string>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/linear_ce/linear_ce_vocab_parallel.h"

namespace lcplan::linear_ce::cuda {

namespace {

// Owns one event so an exception between create and destroy does not leak it.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() { (void)cudaEventDestroy(e); }  // destructor: nothing useful to do on failure
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Makes `waiter` wait for everything queued on `producer` so far (no host synchronisation).
void fence(cudaStream_t producer, cudaStream_t waiter, const Event& ev) {
  CUDA_CHECK(cudaEventRecord(ev.e, producer));
  CUDA_CHECK(cudaStreamWaitEvent(waiter, ev.e, 0));
}

std::vector<int64_t> host_targets(const Problem& p, const int64_t* targets, cudaStream_t stream) {
  std::vector<int64_t> out(static_cast<size_t>(p.tokens > 0 ? p.tokens : 0));
  if (out.empty() || targets == nullptr) return out;
  CUDA_CHECK(cudaMemcpyAsync(out.data(), targets, out.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

// check_vocab_parallel on host copies of the targets; a null device pointer stays null so it is reported as such.
void check(const comm::Comm& c, const Problem& p, DType t, const Options& o, const int64_t* targets,
           cudaStream_t stream) {
  std::vector<int64_t> h;
  std::string copy_error;
  try {
    h = host_targets(p, targets, stream);
  } catch (const std::exception& e) {
    copy_error = std::string("linear_ce: could not read the targets: ") + e.what();
  }
  comm::raise_if_any(c, copy_error);  // a failed copy on one rank must not leave the others waiting below
  check_vocab_parallel(c, p, t, o, targets == nullptr ? nullptr : h.data());
}

}  // namespace

DeviceAllReduce comm_all_reduce(const comm::Comm& c) {
  return [&c](float* buf, size_t count, CrossRankOp op, cudaStream_t stream) {
    const comm::ReduceOp rop = op == CrossRankOp::Max ? comm::ReduceOp::Max : comm::ReduceOp::Sum;
    if (c.backend == comm::Backend::Nccl) {
      const auto cs = static_cast<cudaStream_t>(c.stream);
      if (cs == stream) return comm::all_reduce(c, buf, count, comm::DType::F32, rop);
      // NCCL runs on the communicator's stream: it waits for the tiles, and the caller's stream waits for it.
      const Event ev;
      fence(stream, cs, ev);
      comm::all_reduce(c, buf, count, comm::DType::F32, rop);
      fence(cs, stream, ev);
      return;
    }
    std::vector<float> host(count);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    comm::all_reduce(c, host.data(), count, comm::DType::F32, rop);
    CUDA_CHECK(cudaMemcpyAsync(buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is freed on return
  };
}

void forward_vocab_parallel(const comm::Comm& c, cublasHandle_t handle, const Problem& p, DType t, const void* hidden,
                            const void* weight, const int64_t* targets, float* loss, float* lse, const Options& o,
                            void* workspace, size_t workspace_size, cudaStream_t stream) {
  check(c, p, t, o, targets, stream);
  forward(handle, p, t, hidden, weight, targets, loss, lse, o, comm_all_reduce(c), workspace, workspace_size, stream);
}

void backward_vocab_parallel(const comm::Comm& c, cublasHandle_t handle, const Problem& p, DType t,
                             const void* hidden, const void* weight, const int64_t* targets, const float* lse,
                             const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                             void* workspace, size_t workspace_size, cudaStream_t stream) {
  check(c, p, t, o, targets, stream);
  backward(handle, p, t, hidden, weight, targets, lse, grad_loss, d_hidden, d_weight, o, comm_all_reduce(c), workspace,
           workspace_size, stream);
}

}  // namespace lcplan::linear_ce::cuda
