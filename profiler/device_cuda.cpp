// The CUDA backend: cuBLAS (bf16) and cuBLASLt (fp8) GEMMs, the project's CUDA kernels (kernels/*), NCCL collectives
// through lcplan::comm; every time is device time from CUPTI activity records (cupti_tracer.h): the span from the
// first record's start to the last record's end on the streams the case used, per repeat. Compiled only with CUDA.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "common/user_error.h"
#include "kernels/attention/attention_cuda.h"
#include "kernels/common/cuda_check.h"
#include "kernels/linear_attention/linear_attention_cuda.h"
#include "kernels/linear_ce/linear_ce_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_kernels_cuda.h"
#include "parallel/chunk_schedule.h"
#include "profiler/cupti_tracer.h"
#include "profiler/device.h"
#include "profiler/timing.h"

namespace lcplan::profiler {

bool cuda_compiled() { return true; }

int cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  if (!gpu::device_available())
    return "no usable CUDA device: cudaGetDeviceCount reports none or no NVIDIA driver is loaded";
  return "";
}

namespace {

// Owned device memory (freed in the destructor; a failed free is logged).
struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
    if (n) CUDA_CHECK(cudaMalloc(&p, n));
  }
  ~Buffer() {
    if (p) CUDA_LOG(cudaFree(p));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Deterministic host values in [lo, hi), copied to the device as fp32 or bf16.
std::vector<float> host_values(size_t n, float lo, float hi, uint32_t salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * float(((i + salt) * 2654435761u) % 10007u) / 10007.0f;
  return v;
}
// Uploads at most 4 MiB of values, then doubles them in place on the device (gigabyte buffers fill in
// milliseconds; the values only need to be ordinary numbers, not zeros that would flatter the tensor cores).
constexpr size_t kPattern = size_t(4) << 20;
void replicate(Buffer& b, size_t filled) {
  while (filled > 0 && filled < b.bytes) {
    const size_t n = std::min(filled, b.bytes - filled);
    CUDA_CHECK(cudaMemcpy(static_cast<char*>(b.p) + filled, b.p, n, cudaMemcpyDeviceToDevice));
    filled += n;
  }
}
void upload_f32(Buffer& b, float lo, float hi, uint32_t salt) {
  const std::vector<float> v = host_values(std::min(b.bytes, kPattern) / 4, lo, hi, salt);
  CUDA_CHECK(cudaMemcpy(b.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  replicate(b, v.size() * 4);
}
void upload_bf16(Buffer& b, float lo, float hi, uint32_t salt) {
  const std::vector<float> v = host_values(std::min(b.bytes, kPattern) / 2, lo, hi, salt);
  std::vector<__nv_bfloat16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);
  CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  replicate(b, h.size() * 2);
}

std::string version(int v, int major_div) { return std::to_string(v / major_div) + "." + std::to_string(v % major_div / 10); }

class CudaDevice final : public Device {
 public:
  CudaDevice(const comm::Comm& world, const RepeatOptions& o) : world_(world), o_(o) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &local));
    int local_rank = 0, local_size = 1;
    MPI_CHECK(MPI_Comm_rank(local, &local_rank));
    MPI_CHECK(MPI_Comm_size(local, &local_size));
    MPI_CHECK(MPI_Comm_free(&local));
    // Checked collectively (nodes may differ), so every rank throws together before NCCL is set up.
    const std::string err =
        local_size > devices ? std::to_string(local_size) + " ranks run on a node that has " + std::to_string(devices) +
                                   " CUDA device(s); NCCL needs one GPU per rank (launch at most " +
                                   std::to_string(devices) + " ranks per node)"
                             : "";
    try {
      comm::raise_if_any(world, err);
    } catch (const std::invalid_argument& e) {
      throw UserError(e.what());
    }
    CUDA_CHECK(cudaSetDevice(local_rank));
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, local_rank));
    tracer_ = std::make_unique<CuptiTracer>();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    stream_id_ = tracer_->stream_id(stream_);
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    CUBLAS_CHECK(cublasLtCreate(&lt_));
    nccl_world_ = comm::world_nccl(stream_);
    int drv = 0, rt = 0, blas = 0, nccl = 0;
    uint32_t cupti = 0;
    CUDA_CHECK(cudaDriverGetVersion(&drv));
    CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    CUBLAS_CHECK(cublasGetVersion(blas_, &blas));
    NCCL_CHECK(ncclGetVersion(&nccl));
    CUPTI_CHECK(cuptiGetVersion(&cupti));
    desc_ = std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
            std::to_string(prop_.multiProcessorCount) + " SMs, " + std::to_string(prop_.totalGlobalMem >> 30) +
            " GiB), driver " + version(drv, 1000) + ", runtime " + version(rt, 1000) + ", cuBLAS " + std::to_string(blas) +
            ", NCCL " + std::to_string(nccl) + ", CUPTI API " + std::to_string(cupti);
  }
  ~CudaDevice() override {
    try {
      comm::free_comm(nccl_world_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "CudaDevice: %s\n", e.what());
    }
    if (lt_) CUBLAS_LOG(cublasLtDestroy(lt_));
    if (blas_) CUBLAS_LOG(cublasDestroy(blas_));
    if (stream_) CUDA_LOG(cudaStreamDestroy(stream_));
  }

  std::string backend() const override { return "cuda"; }
  std::string description() const override { return desc_; }
  std::vector<std::string> gemm_types() const override {
    // fp8 tensor cores from compute capability 8.9 (Ada, Hopper, Blackwell).
    if (prop_.major * 10 + prop_.minor >= 89) return {"bf16", "fp8"};
    return {"bf16"};
  }

  Timing gemm(int64_t m, int64_t n, int64_t k, const std::string& type) override {
    if (type == "fp8") return gemm_fp8(m, n, k);
    if (type != "bf16") throw std::invalid_argument("the CUDA backend times bf16 and fp8 GEMMs, not " + type);
    Buffer a(size_t(m * k) * 2), b(size_t(k * n) * 2), c(size_t(m * n) * 2);
    upload_bf16(a, -1, 1, 1);
    upload_bf16(b, -1, 1, 2);
    return time_device([&] {
      moe::gpu::gemm(blas_, false, false, m, n, k, a.p, b.p, c.p, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, stream_);
    }, {stream_});
  }

  Timing grouped_gemm(int experts, int64_t tokens, int64_t hidden, int64_t ffn) override {
    const size_t E = size_t(experts), T = size_t(tokens), H = size_t(hidden), F = size_t(ffn);
    Buffer x(E * T * H * 2), w1(E * H * 2 * F * 2), w2(E * F * H * 2), h1(E * T * 2 * F * 4), act(E * T * F * 2),
        y(E * T * H * 2);
    upload_bf16(x, -1, 1, 3);
    upload_bf16(w1, -0.05f, 0.05f, 4);
    upload_bf16(w2, -0.05f, 0.05f, 5);
    std::vector<int64_t> offsets(E + 1);
    for (size_t e = 0; e <= E; ++e) offsets[e] = int64_t(e * T);
    // The MoE layer's expert step (kernels/moe/moe_cuda.cpp): fc1 into fp32 h1, SwiGLU to bf16, fc2.
    return time_device([&] {
      moe::gpu::grouped_gemm(blas_, false, x.p, w1.p, h1.p, offsets.data(), experts, hidden, 2 * ffn, CUDA_R_16BF,
                             CUDA_R_32F, stream_);
      moe::gpu::launch_swiglu<moe::gpu::bf16>(h1.as<float>(), int64_t(E * T), int(ffn), act.as<moe::gpu::bf16>(), stream_);
      moe::gpu::grouped_gemm(blas_, false, act.p, w2.p, y.p, offsets.data(), experts, ffn, hidden, CUDA_R_16BF,
                             CUDA_R_16BF, stream_);
    }, {stream_});
  }

  Timing attention(const attention::Shape& s) override {
    attention::Options opt;
    attention::validate(s, opt);
    const size_t nq = size_t(s.sq * s.hq * s.d) * 4, nk = size_t(s.sk * s.hkv * s.d) * 4;
    Buffer q(nq), k(nk), v(nk), o(nq), lse(size_t(s.hq * s.sq) * 4), dout(nq), dq(nq), dk(nk), dv(nk),
        ws(attention::cuda::backward_workspace_bytes(s));
    for (Buffer* b : {&q, &k, &v, &dout}) upload_f32(*b, -1, 1, uint32_t(b->bytes));
    return time_device([&] {
      attention::cuda::forward(s, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(), opt, stream_);
      attention::cuda::backward(s, q.as<float>(), k.as<float>(), v.as<float>(), o.as<float>(), lse.as<float>(),
                                dout.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), opt, ws.p, ws.bytes, stream_);
    }, {stream_});
  }

  Timing linear_attention(const linear_attention::Shape& s) override {
    linear_attention::Options opt;
    linear_attention::validate(s, opt);
    const size_t nk = size_t(s.s * s.hk * s.dk) * 4, nv = size_t(s.s * s.hv * s.dv) * 4, ng = size_t(s.s * s.hv) * 4,
                 ns = size_t(s.hv * s.dk * s.dv) * 4;
    linear_attention::Conv conv;
    conv.s = s.s;
    conv.channels = 2 * s.hk * s.dk + s.hv * s.dv;
    const size_t nc = size_t(conv.s * conv.channels) * 4, nw = size_t(conv.channels * conv.kernel) * 4;
    Buffer q(nk), k(nk), v(nv), g(ng), beta(ng), dout(nv), o(nv), state(ns), dq(nk), dk(nk), dv(nv), dg(ng), dbeta(ng),
        x(nc), cw(nw), y(nc), dy(nc), dx(nc), dcw(nw), ws(linear_attention::cuda::backward_workspace_bytes(s, opt));
    for (Buffer* b : {&q, &k, &v, &dout, &x, &dy}) upload_f32(*b, -1, 1, uint32_t(b->bytes));
    upload_f32(g, -0.3f, -0.01f, 16);
    upload_f32(beta, 0.1f, 0.9f, 17);
    upload_f32(cw, -0.5f, 0.5f, 11);
    return time_device([&] {
      linear_attention::cuda::conv1d_forward(conv, x.as<float>(), nullptr, cw.as<float>(), nullptr, y.as<float>(), stream_);
      linear_attention::cuda::forward(s, q.as<float>(), k.as<float>(), v.as<float>(), g.as<float>(), beta.as<float>(),
                                      nullptr, o.as<float>(), state.as<float>(), opt, stream_);
      linear_attention::cuda::backward(s, q.as<float>(), k.as<float>(), v.as<float>(), g.as<float>(), beta.as<float>(),
                                       nullptr, dout.as<float>(), nullptr, dq.as<float>(), dk.as<float>(), dv.as<float>(),
                                       dg.as<float>(), dbeta.as<float>(), nullptr, opt, ws.p, ws.bytes, stream_);
      linear_attention::cuda::conv1d_backward(conv, x.as<float>(), nullptr, cw.as<float>(), nullptr, dy.as<float>(),
                                              dx.as<float>(), nullptr, dcw.as<float>(), nullptr, stream_);
    }, {stream_});
  }

  Timing linear_ce(int64_t tokens, int64_t hidden, int64_t vocab, int64_t vocab_tile, int64_t token_tile,
                   bool materialized) override {
    namespace ce = linear_ce;
    ce::Problem p{tokens, hidden, vocab};
    ce::Options opt;
    // The materialized baseline: one tile holding every logit (the whole [tokens x vocab] matrix), as a framework
    // computing logits then the loss would.
    opt.vocab_tile = materialized ? vocab : vocab_tile;
    opt.token_tile = materialized ? tokens : token_tile;
    ce::validate(p, opt);
    Buffer h(size_t(tokens * hidden) * 2), w(size_t(vocab * hidden) * 2), dh(h.bytes), dw(w.bytes),
        targets(size_t(tokens) * 8), lse(size_t(tokens) * 4), loss(4), grad(4),
        ws(ce::cuda::workspace_bytes(p, ce::DType::BF16, opt));
    upload_bf16(h, -1, 1, 19);
    upload_bf16(w, -0.1f, 0.1f, 20);
    std::vector<int64_t> t(static_cast<size_t>(tokens));
    for (size_t i = 0; i < t.size(); ++i) t[i] = int64_t((i * 2654435761u) % uint64_t(vocab));
    CUDA_CHECK(cudaMemcpy(targets.p, t.data(), t.size() * 8, cudaMemcpyHostToDevice));
    const float one = 1;
    CUDA_CHECK(cudaMemcpy(grad.p, &one, 4, cudaMemcpyHostToDevice));
    return time_device([&] {
      ce::cuda::forward(blas_, p, ce::DType::BF16, h.p, w.p, targets.as<int64_t>(), loss.as<float>(), lse.as<float>(), opt,
                        ws.p, ws.bytes, stream_);
      ce::cuda::backward(blas_, p, ce::DType::BF16, h.p, w.p, targets.as<int64_t>(), lse.as<float>(), grad.as<float>(),
                         dh.p, dw.p, opt, ws.p, ws.bytes, stream_);
    }, {stream_});
  }
  std::string linear_ce_type() const override { return "bf16"; }

  MoeTiming moe_layer(const comm::Comm& ep, const MoeShape& s) override {
    const moe::MoeWeights w = moe::make_weights(s.config, ep.rank, ep.size, 1234);
    moe::gpu::GpuOptions go;
    go.bf16 = true;
    go.overlap = s.overlap;
    moe::gpu::MoeLayerGpu layer(ep, s.config, w, go);
    const moe::ChunkSchedule sched = moe::make_chunk_schedule(s.chunks, {}, s.config.shared_ffn > 0);
    const size_t n = size_t(s.tokens) * size_t(s.config.hidden) * 4;
    Buffer x(n), dout(n), out(n), dx(n);
    upload_f32(x, -1, 1, uint32_t(21 + ep.rank));
    upload_f32(dout, -1, 1, uint32_t(31 + ep.rank));
    const uint32_t compute = tracer_->stream_id(layer.stream()), comm_id = tracer_->stream_id(layer.comm_stream());
    auto sync = [&] {
      CUDA_CHECK(cudaStreamSynchronize(layer.comm_stream()));
      CUDA_CHECK(cudaStreamSynchronize(layer.stream()));
    };
    std::vector<double> fwd, bwd;
    std::vector<OverlapSummary> sf, sb;
    for (int i = 0; i < o_.warmup + o_.repeats; ++i) {
      MPI_CHECK(MPI_Barrier(ep.mpi));
      (void)tracer_->take();
      layer.forward(sched, x.as<float>(), int(s.tokens), out.as<float>());
      sync();
      const Trace tf = complete_trace(tracer_->take());
      layer.backward(sched, dout.as<float>(), dx.as<float>());
      sync();
      const Trace tb = complete_trace(tracer_->take());
      if (i < o_.warmup) continue;
      sf.push_back(overlap_summary(tf.of(compute), tf.of(comm_id)));
      sb.push_back(overlap_summary(tb.of(compute), tb.of(comm_id)));
      fwd.push_back(sf.back().makespan);
      bwd.push_back(sb.back().makespan);
    }
    fwd = slowest_rank(ep, fwd);
    bwd = slowest_rank(ep, bwd);
    MoeTiming t;
    t.forward = summarize(fwd).seconds;
    t.backward = summarize(bwd).seconds;
    std::vector<size_t> order(fwd.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return fwd[a] + bwd[a] < fwd[b] + bwd[b]; });
    if (!order.empty()) t.fwd = sf[order[order.size() / 2]], t.bwd = sb[order[order.size() / 2]];
    return t;
  }

  Timing collective(const comm::Comm& g, Coll c, size_t bytes, int inner) override {
    const size_t n = size_t(g.size), floats = std::max<size_t>(bytes / 4, n), per = floats / n;
    Buffer a(floats * 4), b(floats * 4);
    upload_f32(a, -1, 1, 40);
    std::vector<size_t> counts(n, per), displs(n), zero(n, 0), zdispl(n, 0), sc(n, 0), rc(n, 0);
    for (size_t r = 0; r < n; ++r) displs[r] = r * per;
    // send/recv: every rank sends to the next and receives from the previous, in one NCCL group (an all-to-all-v
    // with two non-zero counts), as nccl-tests sendrecv does; ungrouped NCCL send and recv would deadlock a ring.
    sc[size_t((g.rank + 1) % g.size)] = floats;
    rc[size_t((g.rank + g.size - 1) % g.size)] = floats;
    auto once = [&] {
      switch (c) {
        case Coll::AllReduce: comm::all_reduce(g, a.p, floats, comm::DType::F32, comm::ReduceOp::Sum); break;
        case Coll::AllGather: comm::all_gather(g, a.p, b.p, per, comm::DType::F32); break;
        case Coll::ReduceScatter: comm::reduce_scatter(g, a.p, b.p, per, comm::DType::F32, comm::ReduceOp::Sum); break;
        case Coll::AllToAll:
          comm::all_to_all_v(g, a.p, counts.data(), displs.data(), b.p, counts.data(), displs.data(), comm::DType::F32);
          break;
        case Coll::SendRecv:
          comm::all_to_all_v(g, a.p, sc.data(), zdispl.data(), b.p, rc.data(), zdispl.data(), comm::DType::F32);
          break;
      }
    };
    cudaStream_t st = static_cast<cudaStream_t>(g.stream ? g.stream : stream_);
    return time_device([&] {
      for (int j = 0; j < inner; ++j) once();
    }, {st}, inner, &g);
  }

  Timing copy(size_t bytes) override {
    Buffer a(bytes), b(bytes);
    upload_f32(a, -1, 1, 50);
    return time_device([&] { CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream_)); }, {stream_});
  }

  Timing launch() override {
    // Host seconds to enqueue one of the project's smallest kernels (a one-element add), the launch path every
    // kernel of lcplan's executors pays; CUPTI is not involved (this is host time).
    constexpr int kCalls = 1000;
    Buffer a(4), b(4), c(4);
    auto body = [&] {
      for (int i = 0; i < kCalls; ++i) moe::gpu::launch_add(a.as<float>(), b.as<float>(), 1, c.as<float>(), stream_);
    };
    body();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> s;
    for (int r = 0; r < o_.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kCalls);
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    (void)tracer_->take();
    return summarize(slowest_rank(world_, s));
  }
  std::string launch_what() const override { return "launch of a one-element add kernel (kernels/moe/moe_kernels_cuda.h)"; }

  comm::Comm split(const std::vector<int>& ranks) override { return comm::split(nccl_world_, ranks); }
  void free(comm::Comm& c) override { comm::free_comm(c); }

 private:
  // A trace of complete buffers: dropped records would under-count busy time, so they are an error.
  static Trace complete_trace(const std::vector<ActivityBuffer>& buffers) {
    Trace t = build_trace(buffers);
    if (!t.complete())
      throw std::runtime_error("CUPTI dropped " + std::to_string(t.dropped) +
                               " activity records; the measurement would under-count device time");
    return t;
  }

  // Device time of `body` on `streams`: warm-up, then per repeat a barrier of `sync`, the body, stream syncs, and
  // the span of every CUPTI record on those streams, divided by `inner`; slowest rank, median.
  Timing time_device(const std::function<void()>& body, const std::vector<cudaStream_t>& streams, int inner = 1,
                     const comm::Comm* sync = nullptr) {
    const comm::Comm& barrier = sync ? *sync : world_;
    std::vector<uint32_t> ids;
    for (cudaStream_t s : streams) ids.push_back(tracer_->stream_id(s));
    auto wait = [&] {
      for (cudaStream_t s : streams) CUDA_CHECK(cudaStreamSynchronize(s));
    };
    for (int i = 0; i < o_.warmup; ++i) body(), wait();
    std::vector<double> sec;
    for (int i = 0; i < o_.repeats; ++i) {
      (void)tracer_->take();
      if (barrier.size > 1) MPI_CHECK(MPI_Barrier(barrier.mpi));
      body();
      wait();
      const Trace t = complete_trace(tracer_->take());
      std::vector<Interval> iv;
      for (uint32_t id : ids) {
        const std::vector<Interval> s = t.of(id);
        iv.insert(iv.end(), s.begin(), s.end());
      }
      if (iv.empty()) throw std::runtime_error("CUPTI recorded no activity on the timed streams");
      sec.push_back(span(iv) / std::max(1, inner));
    }
    return summarize(slowest_rank(world_, sec));
  }

  Timing gemm_fp8(int64_t m, int64_t n, int64_t k) {
    // cuBLASLt fp8 (E4M3) GEMM, fp32 accumulation, bf16 output, TN layout as fp8 requires (cuBLAS docs,
    // cublasLtMatmul: "A must be transposed and B non-transposed" for FP8). Column-major D[n x m] = A^T B with A
    // stored k x n and B stored k x m: the row-major C[m x n] = A[m x k] B[k x n] of the bf16 case, same FLOPs.
    // Sizes are multiples of 16 (fp8 leading dimensions); the caller's shapes are.
    Buffer a(size_t(k * n)), b(size_t(k * m)), d(size_t(m * n) * 2), ws(size_t(32) << 20);
    CUDA_CHECK(cudaMemset(a.p, 0x38, a.bytes));  // 0x38 = 1.0 in E4M3
    CUDA_CHECK(cudaMemset(b.p, 0x38, b.bytes));
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    struct Free {
      cublasLtMatmulDesc_t& op;
      cublasLtMatrixLayout_t &la, &lb, &ld;
      cublasLtMatmulPreference_t& pref;
      ~Free() {
        if (pref) CUBLAS_LOG(cublasLtMatmulPreferenceDestroy(pref));
        if (ld) CUBLAS_LOG(cublasLtMatrixLayoutDestroy(ld));
        if (lb) CUBLAS_LOG(cublasLtMatrixLayoutDestroy(lb));
        if (la) CUBLAS_LOG(cublasLtMatrixLayoutDestroy(la));
        if (op) CUBLAS_LOG(cublasLtMatmulDescDestroy(op));
      }
    } free_all{op, la, lb, ld, pref};
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, uint64_t(n), uint64_t(m), n));
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws_bytes = ws.bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0)
      throw std::invalid_argument("cuBLASLt offers no fp8 algorithm for m=" + std::to_string(m) + " n=" +
                                  std::to_string(n) + " k=" + std::to_string(k));
    const float alpha = 1, beta = 0;
    return time_device([&] {
      CUBLAS_CHECK(cublasLtMatmul(lt_, op, &alpha, a.p, la, b.p, lb, &beta, d.p, ld, d.p, ld, &heur.algo, ws.p, ws.bytes,
                                  stream_));
    }, {stream_});
  }

  const comm::Comm& world_;
  RepeatOptions o_;
  cudaDeviceProp prop_{};
  std::unique_ptr<CuptiTracer> tracer_;
  cudaStream_t stream_ = nullptr;
  uint32_t stream_id_ = 0;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  comm::Comm nccl_world_;
  std::string desc_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const comm::Comm& world, const RepeatOptions& o) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty())
    throw UserError("--backend cuda cannot run here: " + why + " (use --backend cpu)");
  return std::make_unique<CudaDevice>(world, o);
}

}  // namespace lcplan::profiler
