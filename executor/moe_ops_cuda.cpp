// DeviceOps' MoE members (layers_cuda.h): the device side of kernels/moe/moe_pass.h, which layers/moe.h runs on the
// executor's stream as the host runs it on HostOps. Tokens, weights and GEMMs are fp32 without TF32 as on the host, so
// both pick the same experts and differ by summation order only. State buffers are DeviceBufs charged to the
// categories the host charges (README "Memory mapping"); host values (counts, row-block tables) are staged from
// pageable memory, so the vectors may go when a call returns.
//
// run_steps issues the plan's chunk schedule (parallel/chunk_schedule.h) on two streams: the all-to-alls on
// comm_stream, everything else on the compute stream, cross-stream dependencies as events, so one chunk's all-to-all
// overlaps another's expert GEMMs as the estimator costs it. The host waits for the compute stream once per pass, in
// chunk_counts, for the router's counts that size the all-to-alls; it never synchronises the device, so a pipeline
// send in flight on another stream cannot stall it (executor/README.md "GPU backend").
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/layers_cuda.h"
#include "executor/ops_cuda.h"
#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_kernels_cuda.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::exec::cuda {

namespace mg = moe::gpu;

namespace {

// Row-major fp32 GEMM on the executor's handle and stream (no TF32, as the executor's other GEMMs).
void gemm(DeviceOps& o, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, const float* B, float* C,
          float beta) {
  mg::gemm(o.handle, ta, tb, m, n, k, A, B, C, CUDA_R_32F, CUDA_R_32F, 1.0f, beta, true, o.stream);
}

// Host values into a device buffer of category c, in the compute stream's order.
DeviceBuf<int64_t> device_copy(DeviceOps& o, const std::vector<int64_t>& v, Category c) {
  DeviceBuf<int64_t> b(o.tr, c, v.size());
  if (!v.empty())
    CUDA_CHECK(cudaMemcpyAsync(b.data(), v.data(), sizeof(int64_t) * v.size(), cudaMemcpyHostToDevice, o.stream));
  return b;
}

// Events of one run_steps, destroyed even when a step throws (a pending event is released once it completes).
struct Events {
  std::vector<cudaEvent_t> ev;
  Events() = default;
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    for (cudaEvent_t e : ev) CUDA_LOG(cudaEventDestroy(e));
  }
  cudaEvent_t make() {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ev.push_back(e);
    return e;
  }
};

}  // namespace

DeviceBuf<int64_t> DeviceOps::upload(const std::vector<int64_t>& v) {
  return device_copy(*this, v, Category::MoeBuffers);
}
DeviceBuf<int64_t> DeviceOps::save_counts(const std::vector<int64_t>& v) {
  return device_copy(*this, v, Category::Activations);
}
std::vector<int64_t> DeviceOps::load_counts(const DeviceBuf<int64_t>& b) {
  std::vector<int64_t> v(b.size());
  if (!v.empty())
    CUDA_CHECK(cudaMemcpyAsync(v.data(), b.data(), sizeof(int64_t) * v.size(), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return v;
}
void DeviceOps::to_f32(const bf16* x, float* y, size_t n) { cuda::to_f32(x, y, n, stream); }

void DeviceOps::gemm32(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n) {
  gemm(*this, false, false, rows, n, k, A, B, C, 0.0f);
}
void DeviceOps::gemm32_bt(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n) {
  gemm(*this, false, true, rows, n, k, A, B, C, 0.0f);
}
void DeviceOps::gemm32_at(const float* A, const float* D, float* G, int64_t rows, int64_t k, int64_t n) {
  gemm(*this, true, false, k, n, rows, A, D, G, 1.0f);
}

void DeviceOps::route(const float* logits, const float* bias, const moe::RouterParams& p, int tokens, float* scores,
                      int* idx, float* w) {
  mg::launch_route(logits, bias, p, tokens, scores, idx, w, stream);
}
void DeviceOps::route_bwd(const float* scores, const int* idx, const float* dw, const moe::RouterParams& p, int tokens,
                          float* dlogits) {
  mg::launch_route_bwd(scores, idx, dw, p, tokens, dlogits, stream);
}

// The host's one wait of a pass: the router's counts per (chunk, expert).
std::vector<int> DeviceOps::chunk_counts(const int* idx, int top_k, int experts, const std::vector<int>& bounds) {
  mg::ChunkBounds cb;
  cb.chunks = int(bounds.size()) - 1;
  for (int ch = 0; ch <= cb.chunks; ++ch) cb.b[ch] = bounds[size_t(ch)];
  std::vector<int> host(size_t(cb.chunks) * size_t(experts));
  DeviceBuf<int> counts(tr, Category::Workspace, host.size());
  mg::launch_chunk_counts(idx, bounds.back(), top_k, experts, cb, counts.data(), stream);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), counts.data(), sizeof(int) * host.size(), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void DeviceOps::expert_major_rows(const int* expert_of_slot, int n, int experts, int* row_of_slot) {
  const size_t bytes = mg::expert_major_rows_workspace(n, experts);
  DeviceBuf<int> offsets(tr, Category::Workspace, size_t(experts) + 1);
  DeviceBuf<float> scratch(tr, Category::Workspace, (bytes + sizeof(float) - 1) / sizeof(float));
  mg::launch_expert_major_rows(expert_of_slot, n, experts, offsets.data(), row_of_slot, scratch.data(),
                               scratch.bytes(), stream);
}

void DeviceOps::permute(const float* x, const int* rows, int tokens, int top_k, int hidden, float* xp) {
  mg::launch_permute<float>(x, rows, tokens, top_k, hidden, xp, stream);
}
void DeviceOps::unpermute(const float* yp, const int* rows, const float* w, int tokens, int top_k, int hidden,
                          const float* shared, const float* gate, float* out) {
  mg::launch_unpermute<float>(yp, rows, w, tokens, top_k, hidden, shared, gate, out, stream);
}
void DeviceOps::unpermute_bwd(const float* dout, const float* yp, const int* rows, const float* w, int tokens,
                              int top_k, int hidden, float* dyp, float* dw) {
  mg::launch_unpermute_bwd<float>(dout, yp, rows, w, tokens, top_k, hidden, dyp, dw, stream);
}
void DeviceOps::swiglu(const float* h1, int64_t rows, int ffn, float* act) {
  mg::launch_swiglu<float>(h1, rows, ffn, act, stream);
}
void DeviceOps::swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, float* dh1) {
  mg::launch_swiglu_bwd<float>(h1, dact, rows, ffn, dh1, stream);
}
void DeviceOps::add(const float* a, const float* b, int64_t n, float* out) { mg::launch_add(a, b, n, out, stream); }
void DeviceOps::copy_blocks(const float* in, float* out, const int64_t* blocks, int nblocks, int64_t max_rows,
                            int hidden, bool to_expert_major) {
  mg::launch_copy_blocks<float>(in, out, blocks, nblocks, max_rows, hidden, to_expert_major, stream);
}
void DeviceOps::shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate) {
  mg::launch_shared_gate(x, g, tokens, hidden, sgate, stream);
}
void DeviceOps::shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden,
                                float* dso, float* dz) {
  mg::launch_shared_gate_bwd<float>(dout, sout, sgate, tokens, hidden, dso, dz, stream);
}

// The step list is the issue order and a step depends only on earlier ones (chunk_schedule.h): a step waits on the
// events of its dependencies on the other stream, then records its own. The comm stream starts after everything queued
// on the compute stream so far (every buffer a comm step touches is allocated by then) and the compute stream ends
// joined on it, so the pass's buffers may be freed in the compute stream's order. Without comm_stream every step runs
// on the compute stream, in list order.
void DeviceOps::run_steps(const std::vector<moe::Step>& steps, const std::function<void(const moe::Step&)>& issue) {
  moe::validate_steps(steps);
  Events events;
  cudaStream_t comm = comm_stream ? comm_stream : stream;
  if (comm != stream) {
    cudaEvent_t start = events.make();
    CUDA_CHECK(cudaEventRecord(start, stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm, start, 0));
  }
  std::vector<cudaEvent_t> done(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const moe::Step& st = steps[i];
    cudaStream_t sm = st.stream == moe::StreamKind::Comm ? comm : stream;
    for (int d : st.deps)
      if (steps[size_t(d)].stream != st.stream) CUDA_CHECK(cudaStreamWaitEvent(sm, done[size_t(d)], 0));
    step_stream = st.stream == moe::StreamKind::Comm ? sm : nullptr;
    issue(st);
    step_stream = nullptr;
    done[i] = events.make();
    CUDA_CHECK(cudaEventRecord(done[i], sm));
  }
  if (comm != stream) {
    cudaEvent_t end = events.make();
    CUDA_CHECK(cudaEventRecord(end, comm));
    CUDA_CHECK(cudaStreamWaitEvent(stream, end, 0));
  }
}

void DeviceOps::all_to_all_step(const comm::Comm& c, const float* send, const size_t* send_counts,
                                const size_t* send_displs, float* recv, const size_t* recv_counts,
                                const size_t* recv_displs) {
  if (!step_stream) throw std::logic_error("MoE all-to-all step issued outside a comm step of run_steps");
  comm::Comm on = c;
  on.stream = step_stream;
  comm::all_to_all_v(on, send, send_counts, send_displs, recv, recv_counts, recv_displs, comm::DType::F32);
}

}  // namespace lcplan::exec::cuda
