#include "kernels/moe/moe_cuda.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/common/bf16.h"
#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_kernels_cuda.h"

namespace lcplan::moe::gpu {

namespace {

// Device buffer that only grows; growing waits for the device because an earlier pass may still read it.
struct DevBuf {
  void* p = nullptr;
  size_t cap = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) CUDA_LOG(cudaFree(p));  // destructors log instead of throwing
  }
  void ensure(size_t bytes) {
    if (bytes <= cap) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (p) CUDA_CHECK(cudaFree(p));
    p = nullptr;
    cap = 0;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    cap = bytes;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

// Pinned host buffer for the small asynchronous copies (counts down, row-block tables up).
struct HostBuf {
  void* p = nullptr;
  size_t cap = 0;
  HostBuf() = default;
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
  ~HostBuf() {
    if (p) CUDA_LOG(cudaFreeHost(p));
  }
  void ensure(size_t bytes) {
    if (bytes <= cap) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (p) CUDA_CHECK(cudaFreeHost(p));
    p = nullptr;
    cap = 0;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    cap = bytes;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

struct EventPool {
  std::vector<cudaEvent_t> ev;
  unsigned flags = cudaEventDisableTiming;
  EventPool() = default;
  explicit EventPool(unsigned f) : flags(f) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : ev) CUDA_LOG(cudaEventDestroy(e));
  }
  void ensure(size_t n) {
    while (ev.size() < n) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
      ev.push_back(e);
    }
  }
};

struct ChunkState {
  int t0 = 0, t1 = 0;
  ChunkLayout lay;     // the all-to-all counts and the row-block table (moe_layer.h chunk_layout)
  HostBuf blocks_host;  // lay.table.blocks in pinned memory for the asynchronous copy
  DevBuf blocks, rows, offsets, xp, xr, xe, h1, act, ye, ye_src, yp;  // forward
  DevBuf dyp, dyr, dye, dact, dh1, dxe, dx_src, dxp;                // backward
  int tokens() const { return t1 - t0; }
  int64_t rows_in() const { return lay.table.rows(); }
};

struct PassTiming {
  EventPool start{cudaEventDefault}, end{cudaEventDefault};
  int first = -1;  // the first issued step: times are measured from its start
  size_t steps = 0;
};

}  // namespace

struct MoeLayerGpu::Impl {
  virtual ~Impl() = default;
  virtual void forward(const ChunkSchedule& s, const float* x, int tokens, float* out) = 0;
  virtual void backward(const ChunkSchedule& s, const float* dout, float* dx) = 0;
  virtual MoeWeights grads() const = 0;
  virtual std::vector<StepTime> step_times(bool backward) const = 0;
  virtual GpuTraffic traffic() const = 0;
  virtual cudaStream_t stream() const = 0;
  virtual cudaStream_t comm_stream() const = 0;
};

namespace {

template <class T>
class Layer final : public MoeLayerGpu::Impl {
 public:
  Layer(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const GpuOptions& o)
      : ep_(ep), c_(c), rp_(router_params(c)), o_(o) {
    if (ep.backend != comm::Backend::Nccl)
      throw std::invalid_argument("MoeLayerGpu needs an NCCL communicator (comm::world_nccl), got an MPI one");
    P_ = ep.size;
    meta_.first_expert = w.first_expert;
    meta_.local_experts = w.local_experts;
    L_ = w.local_experts;
    // Same collective verdict as the CPU layer on the config and shard shape (one token, one chunk: always valid).
    check_moe_args(ep_, c_, meta_, 1, make_chunk_schedule(1));
    const size_t H = c.hidden, E = c.experts, F = c.expert_ffn, S = c.shared_ffn;
    auto need = [](const std::vector<float>& v, size_t n, const char* what) {
      if (v.size() != n)
        throw std::invalid_argument(std::string("MoeLayerGpu: weight ") + what + " has " + std::to_string(v.size()) +
                                    " values, expected " + std::to_string(n));
    };
    need(w.router, H * E, "router");
    need(w.w1, L_ * H * 2 * F, "w1");
    need(w.w2, L_ * F * H, "w2");
    need(w.shared_w1, H * 2 * S, "shared_w1");
    need(w.shared_w2, S * H, "shared_w2");
    if (c.shared_gate && S) need(w.shared_gate, H, "shared_gate");
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    // Communication gets the higher priority so a ready all-to-all is not queued behind GEMM blocks.
    int lo = 0, hi = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, hi));
    ep_.stream = comm_;
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUDA_CHECK(cudaEventCreateWithFlags(&pass_start_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&pass_end_, cudaEventDisableTiming));
    upload_f32(router_, w.router);
    std::vector<float> bias = w.expert_bias;
    bias.resize(E, 0.0f);
    upload_f32(bias_, bias);
    upload_t(w1_, w.w1);
    upload_t(w2_, w.w2);
    upload_t(sw1_, w.shared_w1);
    upload_t(sw2_, w.shared_w2);
    if (c.shared_gate && S) upload_f32(gate_, w.shared_gate);
    g_router_.ensure(sizeof(float) * H * E);
    g_w1_.ensure(sizeof(float) * L_ * H * 2 * F);
    g_w2_.ensure(sizeof(float) * L_ * F * H);
    g_sw1_.ensure(sizeof(float) * H * 2 * S);
    g_sw2_.ensure(sizeof(float) * S * H);
    g_gate_.ensure(sizeof(float) * H);
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  ~Layer() override {
    // Pending work must not outlive the buffers freed by the members' destructors.
    CUDA_LOG(cudaDeviceSynchronize());
    if (blas_) CUBLAS_LOG(cublasDestroy(blas_));
    if (pass_start_) CUDA_LOG(cudaEventDestroy(pass_start_));
    if (pass_end_) CUDA_LOG(cudaEventDestroy(pass_end_));
    if (comm_) CUDA_LOG(cudaStreamDestroy(comm_));
    if (compute_) CUDA_LOG(cudaStreamDestroy(compute_));
  }

  cudaStream_t stream() const override { return compute_; }
  cudaStream_t comm_stream() const override { return comm_; }
  GpuTraffic traffic() const override { return traffic_; }

  void forward(const ChunkSchedule& s, const float* x, int tokens, float* out) override {
    check_moe_args(ep_, c_, meta_, tokens, s);
    // A schedule without the shared-expert step would silently drop the shared expert's output.
    comm::raise_if_any(ep_, !s.shared_expert && c_.shared_ffn > 0
                                ? "the schedule has no shared-expert step but shared_ffn = " + std::to_string(c_.shared_ffn)
                                : std::string());
    const int H = c_.hidden, E = c_.experts, K = c_.top_k, F = c_.expert_ffn, S = c_.shared_ffn, N = s.chunks;
    x_ = x;
    out_ = out;
    tokens_ = tokens;
    chunks_ = N;
    bounds_ = chunk_bounds(tokens, N, s.weights);
    const size_t Tn = tokens;
    logits_.ensure(sizeof(float) * Tn * E);
    scores_.ensure(sizeof(float) * Tn * E);
    idx_.ensure(sizeof(int) * Tn * K);
    w_.ensure(sizeof(float) * Tn * K);
    counts_.ensure(sizeof(int) * N * E);
    h_counts_.ensure(sizeof(int) * N * E);
    xt_.ensure(sizeof(T) * Tn * H * (S ? 1 : 0));
    sh1_.ensure(sizeof(float) * Tn * 2 * S);
    sact_.ensure(sizeof(T) * Tn * S);
    sout_.ensure(sizeof(float) * Tn * H * (S ? 1 : 0));
    sgate_.ensure(sizeof(float) * Tn);
    size_t ws = 0;
    for (int ch = 0; ch < N; ++ch) {
      ChunkState& b = ck_[ch];
      b.t0 = bounds_[ch];
      b.t1 = bounds_[ch + 1];
      const size_t slots = size_t(b.tokens()) * K;
      b.rows.ensure(sizeof(int) * slots);
      b.offsets.ensure(sizeof(int) * (E + 1));
      b.xp.ensure(sizeof(T) * slots * H);
      b.yp.ensure(sizeof(T) * slots * H);
      ws = std::max(ws, expert_major_rows_workspace(int(slots), E));
    }
    perm_ws_.ensure(ws);
    (void)F;
    run(s.forward, fwd_ev_, fwd_time_, [&](const Step& st, cudaStream_t sm) { issue_forward(st, sm); });
  }

  void backward(const ChunkSchedule& s, const float* dout, float* dx) override {
    if (!x_) throw std::logic_error("MoeLayerGpu::backward called before forward");
    if (s.chunks != chunks_)
      throw std::invalid_argument("backward schedule has " + std::to_string(s.chunks) +
                                  " chunks but the forward ran with " + std::to_string(chunks_));
    const int H = c_.hidden, E = c_.experts, K = c_.top_k, F = c_.expert_ffn, S = c_.shared_ffn;
    const size_t Tn = tokens_;
    dw_.ensure(sizeof(float) * Tn * K);
    dlogits_.ensure(sizeof(float) * Tn * E);
    dx_routed_.ensure(sizeof(float) * Tn * H);
    dx_shared_.ensure(sizeof(float) * Tn * H);
    dso_.ensure(sizeof(T) * Tn * H * (S ? 1 : 0));
    dz_.ensure(sizeof(float) * Tn);
    dsact_.ensure(sizeof(float) * Tn * S);
    dsh1_.ensure(sizeof(T) * Tn * 2 * S);
    for (int ch = 0; ch < chunks_; ++ch) {
      ChunkState& b = ck_[ch];
      const size_t slots = size_t(b.tokens()) * K, rows = size_t(b.rows_in());
      b.dyp.ensure(sizeof(T) * slots * H);
      b.dxp.ensure(sizeof(T) * slots * H);
      b.dyr.ensure(sizeof(T) * rows * H);
      b.dye.ensure(sizeof(T) * rows * H);
      b.dxe.ensure(sizeof(T) * rows * H);
      b.dx_src.ensure(sizeof(T) * rows * H);
      b.dact.ensure(sizeof(float) * rows * F);
      b.dh1.ensure(sizeof(T) * rows * 2 * F);
    }
    // Fresh grads each backward (wgrad accumulates over chunks with beta = 1); no shared expert: its dx is 0.
    for (DevBuf* g : {&g_router_, &g_w1_, &g_w2_, &g_sw1_, &g_sw2_, &g_gate_})
      if (g->cap) CUDA_CHECK(cudaMemsetAsync(g->p, 0, g->cap, compute_));
    CUDA_CHECK(cudaMemsetAsync(dx_shared_.p, 0, sizeof(float) * Tn * H, compute_));
    dout_ = dout;
    dx_ = dx;
    run(s.backward, bwd_ev_, bwd_time_, [&](const Step& st, cudaStream_t sm) { issue_backward(st, sm); });
  }

  MoeWeights grads() const override {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    const size_t H = c_.hidden, E = c_.experts, F = c_.expert_ffn, S = c_.shared_ffn;
    MoeWeights g;
    g.first_expert = meta_.first_expert;
    g.local_experts = L_;
    auto get = [](const DevBuf& d, size_t n, std::vector<float>& v) {
      v.resize(n);
      if (n) CUDA_CHECK(cudaMemcpy(v.data(), d.p, sizeof(float) * n, cudaMemcpyDeviceToHost));
    };
    get(g_router_, H * E, g.router);
    g.expert_bias.assign(E, 0.0f);  // selection only, never trained by gradient
    get(g_w1_, L_ * H * 2 * F, g.w1);
    get(g_w2_, L_ * F * H, g.w2);
    get(g_sw1_, H * 2 * S, g.shared_w1);
    get(g_sw2_, S * H, g.shared_w2);
    get(g_gate_, c_.shared_gate && S ? H : 0, g.shared_gate);
    return g;
  }

  std::vector<StepTime> step_times(bool backward) const override {
    if (!o_.time_steps) throw std::logic_error("step_times needs GpuOptions::time_steps");
    const PassTiming& pt = backward ? bwd_time_ : fwd_time_;
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    std::vector<StepTime> out(pt.steps);
    if (pt.first < 0) return out;
    for (size_t i = 0; i < pt.steps; ++i) {
      float a = 0, b = 0;
      CUDA_CHECK(cudaEventElapsedTime(&a, pt.start.ev[pt.first], pt.start.ev[i]));
      CUDA_CHECK(cudaEventElapsedTime(&b, pt.start.ev[pt.first], pt.end.ev[i]));
      out[i] = StepTime{a * 1e-3, b * 1e-3};
    }
    return out;
  }

 private:
  static constexpr comm::DType wire_type() { return sizeof(T) == 2 ? comm::DType::BF16 : comm::DType::F32; }
  static constexpr cudaDataType_t tt() { return cuda_type<T>(); }

  void upload_f32(DevBuf& d, const std::vector<float>& h) {
    d.ensure(sizeof(float) * h.size());
    if (!h.empty()) CUDA_CHECK(cudaMemcpy(d.p, h.data(), sizeof(float) * h.size(), cudaMemcpyHostToDevice));
  }
  void upload_t(DevBuf& d, const std::vector<float>& h) {
    if constexpr (sizeof(T) == 4) {
      upload_f32(d, h);
    } else {
      std::vector<uint16_t> bits(h.size());  // rounded to nearest even, as the hardware conversion does
      for (size_t i = 0; i < h.size(); ++i) bits[i] = f32_to_bf16(h[i]);
      d.ensure(sizeof(uint16_t) * bits.size());
      if (!bits.empty()) CUDA_CHECK(cudaMemcpy(d.p, bits.data(), sizeof(uint16_t) * bits.size(), cudaMemcpyHostToDevice));
    }
  }

  // Issues a step list: a step goes to its stream after waiting on the events of its dependencies on the other
  // stream (same-stream ones are already ordered); then its event is recorded. Host order follows the two
  // in-order queues as simulate() does, so every waited-on event has been recorded before the wait is issued.
  template <class Issue>
  void run(const std::vector<Step>& steps, EventPool& ev, PassTiming& pt, Issue&& issue) {
    validate_steps(steps);
    const size_t n = steps.size();
    ev.ensure(n);
    if (o_.time_steps) {
      pt.start.ensure(n);
      pt.end.ensure(n);
    }
    pt.steps = o_.time_steps ? n : 0;
    pt.first = -1;
    // The comm stream starts after whatever the caller queued on the compute stream (the input, the last pass).
    CUDA_CHECK(cudaEventRecord(pass_start_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(comm_, pass_start_, 0));
    std::array<std::vector<int>, 2> q;  // 0: compute, 1: comm
    for (size_t i = 0; i < n; ++i) q[steps[i].stream == StreamKind::Comm].push_back(int(i));
    std::array<size_t, 2> next = {0, 0};
    std::vector<char> issued(n, 0);
    int last = -1;
    for (size_t done = 0; done < n;) {
      bool progress = false;
      for (int k = 0; k < 2; ++k)  // compute first: its launches queue up before the host blocks on counts
        while (next[k] < q[k].size()) {
          const int i = q[k][next[k]];
          const Step& st = steps[i];
          if (!std::all_of(st.deps.begin(), st.deps.end(), [&](int d) { return issued[d] != 0; })) break;
          cudaStream_t sm = st.stream == StreamKind::Comm ? comm_ : compute_;
          for (int d : st.deps)
            if (steps[d].stream != st.stream) CUDA_CHECK(cudaStreamWaitEvent(sm, ev.ev[d], 0));
          if (!o_.overlap && last >= 0 && steps[last].stream != st.stream)
            CUDA_CHECK(cudaStreamWaitEvent(sm, ev.ev[last], 0));
          if (st.op == StepOp::Counts)  // the host needs the router's counts before it can size the all-to-alls
            for (int d : st.deps) CUDA_CHECK(cudaEventSynchronize(ev.ev[d]));
          if (o_.time_steps) CUDA_CHECK(cudaEventRecord(pt.start.ev[i], sm));
          if (pt.first < 0) pt.first = i;
          issue(st, sm);
          if (o_.time_steps) CUDA_CHECK(cudaEventRecord(pt.end.ev[i], sm));
          CUDA_CHECK(cudaEventRecord(ev.ev[i], sm));
          issued[i] = 1;
          last = i;
          ++next[k];
          ++done;
          progress = true;
        }
      if (!progress) throw std::logic_error("MoE GPU schedule stalled: no step can be issued (invalid step list)");
    }
    // The pass ends joined on the compute stream, so callers only ever wait on stream().
    CUDA_CHECK(cudaEventRecord(pass_end_, comm_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, pass_end_, 0));
  }

  void exchange_counts_and_size(cudaStream_t sm) {
    const int H = c_.hidden, E = c_.experts, K = c_.top_k, F = c_.expert_ffn, N = chunks_, P = P_, L = L_;
    const int* hc = h_counts_.as<int>();  // [chunk][global expert]
    std::vector<size_t> send(size_t(P) * N * L), recv(send.size());
    for (int q = 0; q < P; ++q)
      for (int ch = 0; ch < N; ++ch)
        for (int e = 0; e < L; ++e) send[(size_t(q) * N + ch) * L + e] = size_t(hc[ch * E + q * L + e]);
    comm::exchange_counts(ep_, send.data(), recv.data(), size_t(N) * L);
    const std::vector<int64_t> send64(send.begin(), send.end()), recv64(recv.begin(), recv.end());
    traffic_ = GpuTraffic{};
    int64_t recv_remote = 0;
    for (int ch = 0; ch < N; ++ch) {
      ChunkState& b = ck_[ch];
      b.lay = chunk_layout(send64, recv64, P, ep_.rank, N, L, H, ch);
      const ChunkLayout& lay = b.lay;
      if (lay.rows_sent != int64_t(b.tokens()) * K)
        throw std::logic_error("MoE counts: chunk " + std::to_string(ch) + " sends " + std::to_string(lay.rows_sent) +
                               " rows for " + std::to_string(b.tokens() * K) + " slots");
      traffic_.rows_sent += lay.rows_sent;
      traffic_.rows_sent_remote += lay.rows_sent_remote;
      traffic_.rows_received += lay.rows_received;
      recv_remote += lay.rows_received_remote;
      // Row-block table for the source-major <-> expert-major reorder, in pinned memory for the async copy.
      b.blocks_host.ensure(sizeof(int64_t) * std::max<size_t>(3, lay.table.blocks.size()));
      std::copy(lay.table.blocks.begin(), lay.table.blocks.end(), b.blocks_host.as<int64_t>());
      const int64_t* tab = b.blocks_host.as<int64_t>();
      const size_t rows = size_t(lay.rows_received);
      b.blocks.ensure(sizeof(int64_t) * 3 * std::max(1, b.lay.table.nblocks()));
      b.xr.ensure(sizeof(T) * rows * H);
      b.xe.ensure(sizeof(T) * rows * H);
      b.h1.ensure(sizeof(float) * rows * 2 * F);
      b.act.ensure(sizeof(T) * rows * F);
      b.ye.ensure(sizeof(T) * rows * H);
      b.ye_src.ensure(sizeof(T) * rows * H);
      // On the comm stream: the expert step that reads the table waits on this chunk's dispatch, queued after it.
      if (b.lay.table.nblocks())
        CUDA_CHECK(cudaMemcpyAsync(b.blocks.p, tab, sizeof(int64_t) * 3 * b.lay.table.nblocks(), cudaMemcpyHostToDevice,
                                   sm));
    }
    const double bytes_row = double(sizeof(T)) * H;
    traffic_.a2a_bytes_remote = int64_t(2 * (traffic_.rows_sent_remote + recv_remote) * bytes_row);
    traffic_.expert_flops = 18.0 * H * F * double(traffic_.rows_received);  // 3 GEMM pairs of 6*H*F per row
    traffic_.shared_flops = 18.0 * H * double(c_.shared_ffn) * tokens_;
  }

  // A chunk's received rows between the source-major and expert-major layouts (its block table on the device).
  void copy_blocks(const ChunkState& b, const T* in, T* out, bool to_expert_major, cudaStream_t sm) {
    launch_copy_blocks<T>(in, out, b.blocks.as<int64_t>(), b.lay.table.nblocks(), b.lay.table.max_block_rows,
                          c_.hidden, to_expert_major, sm);
  }

  // One GEMM per local expert that received rows (moe_kernels_cuda's grouped_gemm); weights of expert e are k x n
  // (n x k when trans_w), output rows of type ct.
  void expert_gemms(const ChunkState& b, const T* in, int k, int n, const T* weights, void* out, cudaDataType_t ct,
                    bool trans_w, cudaStream_t sm) {
    grouped_gemm(blas_, trans_w, in, weights, out, b.lay.table.expert_off.data(), L_, k, n, tt(), ct, sm);
  }

  void issue_forward(const Step& st, cudaStream_t sm) {
    const int H = c_.hidden, E = c_.experts, K = c_.top_k, F = c_.expert_ffn, S = c_.shared_ffn, Tn = tokens_;
    switch (st.op) {
      case StepOp::Route: {
        gemm(blas_, false, false, Tn, E, H, x_, router_.p, logits_.p, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, true, sm);
        const float* bias = c_.router == Router::SigmoidGroupLimited ? bias_.as<float>() : nullptr;
        launch_route(logits_.as<float>(), bias, rp_, Tn, scores_.as<float>(), idx_.as<int>(), w_.as<float>(), sm);
        ChunkBounds cb;
        cb.chunks = chunks_;
        for (int ch = 0; ch <= chunks_; ++ch) cb.b[ch] = bounds_[ch];
        launch_chunk_counts(idx_.as<int>(), Tn, K, E, cb, counts_.as<int>(), sm);
        CUDA_CHECK(cudaMemcpyAsync(h_counts_.p, counts_.p, sizeof(int) * chunks_ * E, cudaMemcpyDeviceToHost, sm));
        if (S) launch_cast<T>(x_, int64_t(Tn) * H, xt_.as<T>(), sm);
        break;
      }
      case StepOp::Counts:
        exchange_counts_and_size(sm);
        break;
      case StepOp::Permute: {
        ChunkState& b = ck_[st.chunk];
        const int slots = b.tokens() * K;
        launch_expert_major_rows(idx_.as<int>() + size_t(b.t0) * K, slots, E, b.offsets.as<int>(), b.rows.as<int>(),
                                 perm_ws_.p, perm_ws_.cap, sm);
        launch_permute<T>(x_ + size_t(b.t0) * H, b.rows.as<int>(), b.tokens(), K, H, b.xp.as<T>(), sm);
        break;
      }
      case StepOp::Dispatch: {
        ChunkState& b = ck_[st.chunk];
        comm::all_to_all_v(ep_, b.xp.p, b.lay.send_counts.data(), b.lay.send_displs.data(), b.xr.p, b.lay.recv_counts.data(),
                           b.lay.recv_displs.data(), wire_type());
        break;
      }
      case StepOp::SharedFwd: {
        if (!S) break;
        gemm(blas_, false, false, Tn, 2 * S, H, xt_.p, sw1_.p, sh1_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        launch_swiglu<T>(sh1_.as<float>(), Tn, S, sact_.as<T>(), sm);
        gemm(blas_, false, false, Tn, H, S, sact_.p, sw2_.p, sout_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        if (c_.shared_gate) launch_shared_gate(x_, gate_.as<float>(), Tn, H, sgate_.as<float>(), sm);
        break;
      }
      case StepOp::ExpertFwd: {
        ChunkState& b = ck_[st.chunk];
        const int64_t rows = b.rows_in();
        copy_blocks(b, b.xr.as<T>(), b.xe.as<T>(), true, sm);
        expert_gemms(b, b.xe.as<T>(), H, 2 * F, w1_.as<T>(), b.h1.p, CUDA_R_32F, false, sm);
        launch_swiglu<T>(b.h1.as<float>(), rows, F, b.act.as<T>(), sm);
        expert_gemms(b, b.act.as<T>(), F, H, w2_.as<T>(), b.ye.p, tt(), false, sm);
        copy_blocks(b, b.ye.as<T>(), b.ye_src.as<T>(), false, sm);
        break;
      }
      case StepOp::Combine: {
        ChunkState& b = ck_[st.chunk];  // the reverse route of the dispatch
        comm::all_to_all_v(ep_, b.ye_src.p, b.lay.recv_counts.data(), b.lay.recv_displs.data(), b.yp.p,
                           b.lay.send_counts.data(), b.lay.send_displs.data(), wire_type());
        break;
      }
      case StepOp::Unpermute: {
        ChunkState& b = ck_[st.chunk];
        const float* shared = S ? sout_.as<float>() + size_t(b.t0) * H : nullptr;
        const float* gate = S && c_.shared_gate ? sgate_.as<float>() + b.t0 : nullptr;
        launch_unpermute<T>(b.yp.as<T>(), b.rows.as<int>(), w_.as<float>() + size_t(b.t0) * K, b.tokens(), K, H,
                            shared, gate, out_ptr(b.t0), sm);
        break;
      }
      default:
        throw std::logic_error(std::string("forward schedule has a backward step: ") + op_name(st.op));
    }
  }

  void issue_backward(const Step& st, cudaStream_t sm) {
    const int H = c_.hidden, E = c_.experts, K = c_.top_k, F = c_.expert_ffn, S = c_.shared_ffn, Tn = tokens_;
    switch (st.op) {
      case StepOp::UnpermuteBwd: {
        ChunkState& b = ck_[st.chunk];
        launch_unpermute_bwd<T>(dout_ + size_t(b.t0) * H, b.yp.as<T>(), b.rows.as<int>(),
                                w_.as<float>() + size_t(b.t0) * K, b.tokens(), K, H, b.dyp.as<T>(),
                                dw_.as<float>() + size_t(b.t0) * K, sm);
        break;
      }
      case StepOp::CombineBwd: {
        ChunkState& b = ck_[st.chunk];  // output grads travel the dispatch route
        comm::all_to_all_v(ep_, b.dyp.p, b.lay.send_counts.data(), b.lay.send_displs.data(), b.dyr.p, b.lay.recv_counts.data(),
                           b.lay.recv_displs.data(), wire_type());
        break;
      }
      case StepOp::SharedBwd: {
        if (!S) break;
        const float* sg = c_.shared_gate ? sgate_.as<float>() : nullptr;
        launch_shared_gate_bwd<T>(dout_, sout_.as<float>(), sg, Tn, H, dso_.as<T>(), dz_.as<float>(), sm);
        gemm(blas_, true, false, S, H, Tn, sact_.p, dso_.p, g_sw2_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        gemm(blas_, false, true, Tn, S, H, dso_.p, sw2_.p, dsact_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        launch_swiglu_bwd<T>(sh1_.as<float>(), dsact_.as<float>(), Tn, S, dsh1_.as<T>(), sm);
        gemm(blas_, true, false, H, 2 * S, Tn, xt_.p, dsh1_.p, g_sw1_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        gemm(blas_, false, true, Tn, H, 2 * S, dsh1_.p, sw1_.p, dx_shared_.p, tt(), CUDA_R_32F, 1.0f, 0.0f, false, sm);
        if (c_.shared_gate) {  // gate grad x^T dz and its input grad dz (x) g, both fp32 rank-1 products
          gemm(blas_, true, false, H, 1, Tn, x_, dz_.p, g_gate_.p, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, false, sm);
          gemm(blas_, false, false, Tn, H, 1, dz_.p, gate_.p, dx_shared_.p, CUDA_R_32F, CUDA_R_32F, 1.0f, 1.0f, false,
               sm);
        }
        break;
      }
      case StepOp::ExpertDgrad: {
        ChunkState& b = ck_[st.chunk];
        copy_blocks(b, b.dyr.as<T>(), b.dye.as<T>(), true, sm);
        expert_gemms(b, b.dye.as<T>(), H, F, w2_.as<T>(), b.dact.p, CUDA_R_32F, true, sm);
        launch_swiglu_bwd<T>(b.h1.as<float>(), b.dact.as<float>(), b.rows_in(), F, b.dh1.as<T>(), sm);
        expert_gemms(b, b.dh1.as<T>(), 2 * F, H, w1_.as<T>(), b.dxe.p, tt(), true, sm);
        copy_blocks(b, b.dxe.as<T>(), b.dx_src.as<T>(), false, sm);
        break;
      }
      case StepOp::DispatchBwd: {
        ChunkState& b = ck_[st.chunk];  // input grads travel the combine route
        comm::all_to_all_v(ep_, b.dx_src.p, b.lay.recv_counts.data(), b.lay.recv_displs.data(), b.dxp.p,
                           b.lay.send_counts.data(), b.lay.send_displs.data(), wire_type());
        break;
      }
      case StepOp::ExpertWgrad: {
        // Delayed: every chunk's weight grads after the last dgrad, while the tail dispatch-bwd is in flight.
        for (int ch = 0; ch < chunks_; ++ch) {
          const ChunkState& b = ck_[ch];
          for (int e = 0; e < L_; ++e) {
            const int64_t r0 = b.lay.table.expert_off[e], m = b.lay.table.expert_off[e + 1] - r0;
            if (!m) continue;
            gemm(blas_, true, false, F, H, m, b.act.as<T>() + r0 * F, b.dye.as<T>() + r0 * H,
                 g_w2_.as<float>() + size_t(e) * F * H, tt(), CUDA_R_32F, 1.0f, 1.0f, false, sm);
            gemm(blas_, true, false, H, 2 * F, m, b.xe.as<T>() + r0 * H, b.dh1.as<T>() + r0 * 2 * F,
                 g_w1_.as<float>() + size_t(e) * H * 2 * F, tt(), CUDA_R_32F, 1.0f, 1.0f, false, sm);
          }
        }
        break;
      }
      case StepOp::PermuteBwd: {
        ChunkState& b = ck_[st.chunk];
        launch_unpermute<T>(b.dxp.as<T>(), b.rows.as<int>(), nullptr, b.tokens(), K, H, nullptr, nullptr,
                            dx_routed_.as<float>() + size_t(b.t0) * H, sm);
        break;
      }
      case StepOp::RouterBwd: {
        launch_route_bwd(scores_.as<float>(), idx_.as<int>(), dw_.as<float>(), rp_, Tn, dlogits_.as<float>(), sm);
        gemm(blas_, true, false, H, E, Tn, x_, dlogits_.p, g_router_.p, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, true, sm);
        launch_add(dx_routed_.as<float>(), dx_shared_.as<float>(), int64_t(Tn) * H, dx_, sm);
        gemm(blas_, false, true, Tn, H, E, dlogits_.p, router_.p, dx_, CUDA_R_32F, CUDA_R_32F, 1.0f, 1.0f, true, sm);
        break;
      }
      default:
        throw std::logic_error(std::string("backward schedule has a forward step: ") + op_name(st.op));
    }
  }

  float* out_ptr(int t0) const { return out_ + size_t(t0) * c_.hidden; }

  comm::Comm ep_;
  MoeConfig c_;
  RouterParams rp_;
  GpuOptions o_;
  MoeWeights meta_;  // shard shape only (first / local experts) for check_moe_args
  int P_ = 1, L_ = 0;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaEvent_t pass_start_ = nullptr, pass_end_ = nullptr;
  EventPool fwd_ev_, bwd_ev_;
  PassTiming fwd_time_, bwd_time_;
  GpuTraffic traffic_;
  // weights (T: expert/shared matrices; fp32: router, bias, gate) and their fp32 grads
  DevBuf router_, bias_, gate_, w1_, w2_, sw1_, sw2_;
  DevBuf g_router_, g_w1_, g_w2_, g_sw1_, g_sw2_, g_gate_;
  // pass state
  const float* x_ = nullptr;
  float* out_ = nullptr;
  const float* dout_ = nullptr;
  float* dx_ = nullptr;
  int tokens_ = 0, chunks_ = 0;
  std::vector<int> bounds_;
  DevBuf logits_, scores_, idx_, w_, counts_, xt_, sh1_, sact_, sout_, sgate_, perm_ws_;
  DevBuf dw_, dlogits_, dx_routed_, dx_shared_, dso_, dz_, dsact_, dsh1_;
  HostBuf h_counts_;
  std::array<ChunkState, kMaxChunks> ck_;
};

}  // namespace

MoeLayerGpu::MoeLayerGpu(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const GpuOptions& o) {
  if (o.bf16) impl_ = std::make_unique<Layer<bf16>>(ep, c, w, o);
  else impl_ = std::make_unique<Layer<float>>(ep, c, w, o);
}

MoeLayerGpu::~MoeLayerGpu() = default;

void MoeLayerGpu::forward(const ChunkSchedule& s, const float* x, int tokens, float* out) {
  impl_->forward(s, x, tokens, out);
}
void MoeLayerGpu::backward(const ChunkSchedule& s, const float* dout, float* dx) { impl_->backward(s, dout, dx); }
MoeWeights MoeLayerGpu::grads() const { return impl_->grads(); }
std::vector<StepTime> MoeLayerGpu::step_times(bool backward) const { return impl_->step_times(backward); }
GpuTraffic MoeLayerGpu::traffic() const { return impl_->traffic(); }
cudaStream_t MoeLayerGpu::stream() const { return impl_->stream(); }
cudaStream_t MoeLayerGpu::comm_stream() const { return impl_->comm_stream(); }

}  // namespace lcplan::moe::gpu
