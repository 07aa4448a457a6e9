// The MoE FFN on the GPU backend (DeviceOps::moe_fwd / moe_bwd): the host's layer (kernels/moe/moe_cpu.cpp, run by
// layers.cpp) step for step, on the executor's stream, with kernels/moe's CUDA kernels (routing, expert-major
// permutation, SwiGLU, row-block reorder, shared-expert gate) and NCCL all-to-all-v over the EP group. Tokens, weights
// and GEMMs are fp32 without TF32 as on the host, so both pick the same experts and differ by summation order only.
// Every state buffer is a DeviceBuf charged to the category the host charges it to (README "Memory mapping"), and
// the saved tensors (logits, probabilities, xe, yp, h1, activations, counts) have the host's sizes.
//
// Each pass issues the plan's chunk schedule (parallel/chunk_schedule.h) on two streams: the all-to-alls on
// DeviceOps::comm_stream, everything else on the compute stream, cross-stream dependencies as events, so one chunk's
// all-to-all overlaps another's expert GEMMs as the estimator costs it. The host waits for the compute stream once per
// pass, before the schedule, for the router's counts that size the all-to-alls; it never synchronises the device, so a
// pipeline send in flight on another stream cannot stall it (executor/README.md "GPU backend").
// Under TP the shared expert is Megatron's SharedExpertMLP with sequence parallelism (fc1 column-parallel on the
// gathered tokens, fc2 row-parallel reduce-scattered back, fp32 sums as on the host); the routed experts see this
// rank's rows. Under ETP each chunk's received rows are all-gathered over the ETP group, every ETP rank runs its FFN
// columns on all of them, and the partial outputs are reduce-scattered back, summed in ETP-rank order (moe_layer.h).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/layers_cuda.h"
#include "executor/layers/decoder_layer.h"
#include "executor/ops_cuda.h"
#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_kernels_cuda.h"
#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_math.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::exec::cuda {
namespace {

namespace mg = moe::gpu;

// Row-major fp32 GEMM on the executor's handle and stream (no TF32, as the executor's other GEMMs).
void gemm32(DeviceOps& o, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, const float* B, float* C,
            float beta) {
  mg::gemm(o.handle, ta, tb, m, n, k, A, B, C, CUDA_R_32F, CUDA_R_32F, 1.0f, beta, true, o.stream);
}

// The layer's weights widened from the bf16 unit into fp32 workspace, the tensors the host's moe_weights widens.
struct DevMoeWeights {
  DeviceBuf<float> router, bias, w1, w2, sw1, sw2, gate;
};

DevMoeWeights widen_weights(DeviceOps& o, const Ctx& c, const UnitLayout& u, const UnitView& w) {
  const moe::MoeConfig& cfg = c.d.moe;
  const size_t H = size_t(cfg.hidden), E = size_t(cfg.experts), F = size_t(cfg.expert_ffn / c.d.etp),
               S = size_t(c.d.shared_local), L = E / size_t(c.pg.ep.size);
  DevMoeWeights r;
  r.router = o.widen(w.dense + u.off.router, H * E);
  if (cfg.router == moe::Router::SigmoidGroupLimited) r.bias = o.widen(w.dense + u.off.expert_bias, E);
  r.w1 = o.widen(w.expert + u.off.w1, L * H * 2 * F);
  r.w2 = o.widen(w.expert + u.off.w2, L * F * H);
  if (S) {
    r.sw1 = o.widen(w.dense + u.off.shared_w1, H * 2 * S);
    r.sw2 = o.widen(w.dense + u.off.shared_w2, S * H);
  }
  if (S && c.d.shared_gate) r.gate = o.widen(w.dense + u.off.shared_gate, H);
  return r;
}

// One chunk of the EP schedule: its tokens, its all-to-all layout (moe_layer.h chunk_layout: where its slots go and
// what this rank's experts receive), the block table of the rows the expert GEMMs run on (every ETP rank's received
// rows under ETP, else this rank's; source-major as gathered, expert-major as the GEMMs want), and its state buffers,
// as moe_cpu.cpp's ChunkBuffers.
struct DevChunk {
  int t0 = 0, t1 = 0;
  moe::ChunkLayout lay;
  std::vector<int64_t> peer_rows;  // rows each ETP rank received (ETP only)
  moe::BlockTable gemm;            // block table over (ETP rank, source) x local expert
  DeviceBuf<int> rows;                       // slot (t - t0) * K + k -> row of xp / yp
  DeviceBuf<int64_t> blocks;                 // gemm.blocks on the device
  DeviceBuf<float> xp, xr, xe, h1, act, ye_src, yp;
  int tokens() const { return t1 - t0; }
  int64_t rows_in() const { return gemm.rows(); }  // rows of the expert GEMMs
};

struct DevRouting {
  DeviceBuf<float> scores, w;
  DeviceBuf<int> idx;
  std::vector<int64_t> meta;  // counts_recv [source][chunk][local expert], then under ETP every ETP rank's: moe_meta
  std::vector<DevChunk> chunks;
  int64_t rows_received = 0;  // rows of this rank's expert GEMMs (under ETP, every ETP rank's received rows)
};

// The host layer's collective argument check, with the shard shape of this rank's unit.
void check_args(const Ctx& c, int64_t rows) {
  moe::MoeWeights shape;
  shape.local_experts = c.d.moe.experts / c.pg.ep.size;
  shape.first_expert = c.pg.ep.rank * shape.local_experts;
  shape.ffn_local = c.d.moe.expert_ffn / c.pg.etp.size;
  moe::check_moe_args(c.pg.ep, c.pg.etp, c.d.moe, shape, int(rows), c.sched);
}

// ETP (Megatron gather_from_sequence_parallel_region over the expert-TP group, uneven sizes): this rank's `mine` rows
// to every ETP rank, every ETP rank's rows into `all`, in ETP-rank order.
void etp_gather(const Ctx& c, const DevChunk& b, const float* mine, float* all, int64_t H) {
  const int Q = c.pg.etp.size;
  const size_t nq = size_t(Q);
  std::vector<size_t> sc(nq, size_t(b.lay.rows_received * H)), sd(nq, 0), rc(nq), rd(nq);
  size_t at = 0;
  for (int q = 0; q < Q; ++q) {
    rc[size_t(q)] = size_t(b.peer_rows[size_t(q)] * H);
    rd[size_t(q)] = at;
    at += rc[size_t(q)];
  }
  comm::all_to_all_v(c.pg.etp, mine, sc.data(), sd.data(), all, rc.data(), rd.data(), comm::DType::F32);
}

// ETP reduce-scatter of partial rows (ETP-rank-major, as gathered): this rank's rows summed over the ETP ranks in rank
// order, as the host's etp_reduce_scatter, so every rank adds the same partials in the same order.
void etp_reduce_scatter(DeviceOps& o, const Ctx& c, const DevChunk& b, const float* partial, float* mine, int64_t H) {
  const int Q = c.pg.etp.size;
  const size_t n = size_t(b.lay.rows_received * H), nq = size_t(Q);
  std::vector<size_t> sc(nq), sd(nq), rc(nq, n), rd(nq);
  size_t at = 0;
  for (int q = 0; q < Q; ++q) {
    sc[size_t(q)] = size_t(b.peer_rows[size_t(q)] * H);
    sd[size_t(q)] = at;
    at += sc[size_t(q)];
    rd[size_t(q)] = size_t(q) * n;
  }
  DeviceBuf<float> got = o.ws(size_t(Q) * n);
  comm::all_to_all_v(c.pg.etp, partial, sc.data(), sd.data(), got.data(), rc.data(), rd.data(), comm::DType::F32);
  o.copy(got.data(), n, mine);
  for (int q = 1; q < Q; ++q) o.accumulate(got.data() + size_t(q) * n, mine, n);
}

// Routes this rank's tokens from router logits (top-k experts, weights, scores), then lays out every chunk: the
// expert-major rows of its slots, and from the receive counts (exchanged over EP and all-gathered over ETP, or the
// forward's `saved_meta`) the all-to-all counts and the GEMMs' row-block table. The host waits here for the router's
// counts.
DevRouting route(DeviceOps& o, Ctx& c, const DevMoeWeights& W, const float* logits, const int64_t* saved_meta) {
  const moe::MoeConfig& cfg = c.d.moe;
  const int R = int(c.rows), H = cfg.hidden, E = cfg.experts, K = cfg.top_k, P = c.pg.ep.size, L = E / P,
            N = c.sched.chunks, Q = c.pg.etp.size;
  DevRouting rt;
  rt.scores = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(R) * E);
  rt.idx = DeviceBuf<int>(o.tr, Category::MoeBuffers, size_t(R) * K);
  rt.w = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(R) * K);
  const float* bias = cfg.router == moe::Router::SigmoidGroupLimited ? W.bias.data() : nullptr;
  mg::launch_route(logits, bias, moe::router_params(cfg), R, rt.scores.data(), rt.idx.data(), rt.w.data(), o.stream);
  const std::vector<int> bounds = moe::chunk_bounds(R, N, c.sched.weights);
  mg::ChunkBounds cb;
  cb.chunks = N;
  for (int ch = 0; ch <= N; ++ch) cb.b[ch] = bounds[size_t(ch)];
  std::vector<int> hc(size_t(N) * E);
  {
    DeviceBuf<int> counts(o.tr, Category::Workspace, hc.size());
    mg::launch_chunk_counts(rt.idx.data(), R, K, E, cb, counts.data(), o.stream);
    CUDA_CHECK(cudaMemcpyAsync(hc.data(), counts.data(), sizeof(int) * hc.size(), cudaMemcpyDeviceToHost, o.stream));
    CUDA_CHECK(cudaStreamSynchronize(o.stream));
  }
  std::vector<int64_t> send(size_t(P) * N * L);
  for (int q = 0; q < P; ++q)
    for (int ch = 0; ch < N; ++ch)
      for (int e = 0; e < L; ++e) send[(size_t(q) * N + ch) * L + e] = hc[size_t(ch) * E + q * L + e];
  const size_t own = send.size();
  if (saved_meta) {
    rt.meta.assign(saved_meta, saved_meta + own * (Q > 1 ? 1 + size_t(Q) : 1));
  } else {
    const std::vector<size_t> s(send.begin(), send.end());
    std::vector<size_t> r(own);
    comm::exchange_counts(c.pg.ep, s.data(), r.data(), size_t(N) * L);
    rt.meta.assign(r.begin(), r.end());
    if (Q > 1) {  // every ETP rank's receive counts: an all-to-all of Q copies of this rank's is their all-gather
      std::vector<size_t> copies(own * size_t(Q)), all(copies.size());
      for (int q = 0; q < Q; ++q) std::copy(r.begin(), r.end(), copies.begin() + ptrdiff_t(own * size_t(q)));
      comm::exchange_counts(c.pg.etp, copies.data(), all.data(), own);
      rt.meta.insert(rt.meta.end(), all.begin(), all.end());
    }
  }
  const std::vector<int64_t> counts_recv(rt.meta.begin(), rt.meta.begin() + ptrdiff_t(own));
  const std::vector<int64_t> counts_recv_etp(rt.meta.begin() + ptrdiff_t(own), rt.meta.end());
  rt.chunks.resize(size_t(N));
  for (int ch = 0; ch < N; ++ch) {
    DevChunk& b = rt.chunks[size_t(ch)];
    b.t0 = bounds[size_t(ch)];
    b.t1 = bounds[size_t(ch) + 1];
    b.lay = moe::chunk_layout(send, counts_recv, P, c.pg.ep.rank, N, L, H, ch);
    if (b.lay.rows_sent != int64_t(b.tokens()) * K)
      throw std::logic_error("device MoE counts: chunk " + std::to_string(ch) + " sends " +
                             std::to_string(b.lay.rows_sent) + " rows for " + std::to_string(b.tokens() * K) +
                             " slots");
    if (Q > 1) {
      const std::vector<int64_t> by_block = moe::etp_by_block(counts_recv_etp, Q, P, N, L, ch);
      b.peer_rows = moe::etp_rows(by_block, Q, P, L);
      b.gemm = moe::block_table(by_block, P * Q, L);
    } else {
      b.gemm = b.lay.table;
    }
    rt.rows_received += b.gemm.rows();  // the rows the experts' GEMMs run on, as the host counts them
    // From pageable memory: staged before the call returns.
    b.blocks = DeviceBuf<int64_t>(o.tr, Category::MoeBuffers, b.gemm.blocks.size());
    if (!b.gemm.blocks.empty())
      CUDA_CHECK(cudaMemcpyAsync(b.blocks.data(), b.gemm.blocks.data(), sizeof(int64_t) * b.gemm.blocks.size(),
                                 cudaMemcpyHostToDevice, o.stream));
    // Stable expert-major rows of the chunk's slots: moe_math.h's order, the host's send_layout.
    const int slots = b.tokens() * K;
    b.rows = DeviceBuf<int>(o.tr, Category::MoeBuffers, size_t(slots));
    if (slots) {
      const size_t bytes = mg::expert_major_rows_workspace(slots, E);
      DeviceBuf<int> offsets(o.tr, Category::Workspace, size_t(E) + 1);
      DeviceBuf<float> scratch(o.tr, Category::Workspace, (bytes + sizeof(float) - 1) / sizeof(float));
      mg::launch_expert_major_rows(rt.idx.data() + size_t(b.t0) * K, slots, E, offsets.data(), b.rows.data(),
                                   scratch.data(), scratch.bytes(), o.stream);
    }
  }
  return rt;
}

// One GEMM per local expert with rows: out rows [off[e], off[e+1]) = in rows x W_e, W_e = w + e * k * n (k x n, or
// n x k when trans_w).
void expert_gemms(DeviceOps& o, const DevChunk& b, const float* in, int64_t k, int64_t n, const float* w, float* out,
                  bool trans_w) {
  const std::vector<int64_t>& off = b.gemm.expert_off;
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int64_t r0 = off[e], m = off[e + 1] - r0;
    if (m) gemm32(o, false, trans_w, m, n, k, in + r0 * k, w + int64_t(e) * k * n, out + r0 * n, 0.0f);
  }
}

// A chunk's GEMM rows between the source-major (as received or gathered) and expert-major layouts.
void reorder(DeviceOps& o, const DevChunk& b, const float* in, float* out, int64_t H, bool to_expert_major) {
  if (b.gemm.nblocks())
    mg::launch_copy_blocks<float>(in, out, b.blocks.data(), b.gemm.nblocks(), b.gemm.max_block_rows, int(H),
                                  to_expert_major, o.stream);
}

// A chunk member of every chunk, rounded to bf16 one after another: the host's concat16.
template <class F>
DeviceBuf<bf16> concat16(DeviceOps& o, std::vector<DevChunk>& chunks, F member) {
  size_t n = 0;
  for (DevChunk& k : chunks) n += member(k).size();
  DeviceBuf<bf16> out(o.tr, Category::Activations, n);
  size_t at = 0;
  for (DevChunk& k : chunks) {
    o.to_bf16(member(k).data(), out.data() + at, member(k).size());
    at += member(k).size();
  }
  return out;
}

// The next n values of a saved bf16 tensor, widened into a chunk's fp32 state buffer.
DeviceBuf<float> take(DeviceOps& o, const DeviceBuf<bf16>& src, size_t& at, size_t n) {
  DeviceBuf<float> b(o.tr, Category::MoeBuffers, n);
  if (n) cuda::to_f32(src.data() + at, b.data(), n, o.stream);
  at += n;
  return b;
}

// The shared expert: fc1 and SwiGLU on every local token (all-gathered over TP), then out = fc2 back on this rank's
// rows (reduce-scattered over TP) and the gate sigmoid(x . g) on them (the kernel's SharedFwd; under TP, Megatron's
// SharedExpertMLP as layers.cpp shared_fwd_tp runs it).
struct DevShared {
  DeviceBuf<float> h1, act, out, gate;
};
void shared_out(DeviceOps& o, Ctx& c, const DevMoeWeights& W, const float* x, DevShared& s) {
  const int64_t T = c.tokens, R = c.rows, H = c.d.moe.hidden, S = c.d.shared_local;
  s.out = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(R * H));
  if (c.tp == 1) {
    gemm32(o, false, false, R, H, S, s.act.data(), W.sw2.data(), s.out.data(), 0.0f);
  } else {
    DeviceBuf<float> partial = o.ws(size_t(T * H));
    gemm32(o, false, false, T, H, S, s.act.data(), W.sw2.data(), partial.data(), 0.0f);
    comm::reduce_scatter(c.pg.tp, partial.data(), s.out.data(), size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
  }
  if (c.d.shared_gate) {
    s.gate = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(R));
    mg::launch_shared_gate(x, W.gate.data(), int(R), int(H), s.gate.data(), o.stream);
  }
}
void shared_fwd(DeviceOps& o, Ctx& c, const DevMoeWeights& W, const float* x, DevShared& s) {
  const int64_t T = c.tokens, H = c.d.moe.hidden, S = c.d.shared_local;
  s.h1 = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(T * 2 * S));
  s.act = DeviceBuf<float>(o.tr, Category::MoeBuffers, size_t(T * S));
  gemm32(o, false, false, T, 2 * S, H, impl::sp_gather(o, c, x, H).p, W.sw1.data(), s.h1.data(), 0.0f);
  mg::launch_swiglu<float>(s.h1.data(), T, int(S), s.act.data(), o.stream);
  shared_out(o, c, W, x, s);
}

// Its backward (the kernel's SharedBwd; under TP layers.cpp shared_bwd_tp): the gate's and both GEMMs' weight
// gradients accumulated into the unit's, the input gradient written to dx (this rank's rows).
void shared_bwd(DeviceOps& o, Ctx& c, const UnitLayout& u, const UnitGrad& g, const DevMoeWeights& W,
                const DevShared& s, const float* x, const float* dy, float* dx) {
  const int64_t T = c.tokens, R = c.rows, H = c.d.moe.hidden, S = c.d.shared_local;
  DeviceBuf<float> dso = o.ws(size_t(R * H)), dz = o.ws(size_t(R));
  mg::launch_shared_gate_bwd<float>(dy, s.out.data(), c.d.shared_gate ? s.gate.data() : nullptr, int(R), int(H),
                                    dso.data(), dz.data(), o.stream);
  DeviceBuf<float> dsh1 = o.ws(size_t(T * 2 * S));
  {
    const impl::Rows<DeviceOps> dso_all = impl::sp_gather(o, c, dso.data(), H);
    gemm32(o, true, false, S, H, T, s.act.data(), dso_all.p, impl::gd(g, u.off.shared_w2), 1.0f);
    DeviceBuf<float> dsact = o.ws(size_t(T * S));
    gemm32(o, false, true, T, S, H, dso_all.p, W.sw2.data(), dsact.data(), 0.0f);
    mg::launch_swiglu_bwd<float>(s.h1.data(), dsact.data(), T, int(S), dsh1.data(), o.stream);
  }
  gemm32(o, true, false, H, 2 * S, T, impl::sp_gather(o, c, x, H).p, dsh1.data(), impl::gd(g, u.off.shared_w1), 1.0f);
  if (c.tp == 1) {
    gemm32(o, false, true, R, H, 2 * S, dsh1.data(), W.sw1.data(), dx, 0.0f);
  } else {
    DeviceBuf<float> partial = o.ws(size_t(T * H));
    gemm32(o, false, true, T, H, 2 * S, dsh1.data(), W.sw1.data(), partial.data(), 0.0f);
    comm::reduce_scatter(c.pg.tp, partial.data(), dx, size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
  }
  if (c.d.shared_gate) {  // the gate's rank-1 products: x^T dz into its gradient, dz g^T into the input gradient
    gemm32(o, true, false, H, 1, R, x, dz.data(), impl::gd(g, u.off.shared_gate), 1.0f);
    gemm32(o, false, false, R, H, 1, dz.data(), W.gate.data(), dx, 1.0f);
  }
}

// Issues a schedule's step list (chunk_schedule.h: the list is the issue order and a step depends only on earlier
// ones) on the compute stream and the comm stream (o.comm_stream; null: every step on the compute stream, in list
// order): a step waits on the events of its dependencies on the other stream, then records its own. The comm stream
// starts after everything queued on the compute stream so far (every buffer a comm step touches is allocated by then)
// and the compute stream ends joined on it, so the pass's buffers may be freed in the compute stream's order. The
// host never waits here. issue(step, stream) enqueues one step.
template <class Issue>
void run_steps(DeviceOps& o, const std::vector<moe::Step>& steps, Issue&& issue) {
  moe::validate_steps(steps);
  struct Events {  // destroyed even when a step throws (a pending event is released once it completes)
    std::vector<cudaEvent_t> ev;
    ~Events() {
      for (cudaEvent_t e : ev) CUDA_LOG(cudaEventDestroy(e));
    }
    cudaEvent_t make() {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ev.push_back(e);
      return e;
    }
  } events;
  cudaStream_t comm = o.comm_stream ? o.comm_stream : o.stream;
  if (comm != o.stream) {
    cudaEvent_t start = events.make();
    CUDA_CHECK(cudaEventRecord(start, o.stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm, start, 0));
  }
  std::vector<cudaEvent_t> done(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const moe::Step& st = steps[i];
    cudaStream_t sm = st.stream == moe::StreamKind::Comm ? comm : o.stream;
    for (int d : st.deps)
      if (steps[size_t(d)].stream != st.stream) CUDA_CHECK(cudaStreamWaitEvent(sm, done[size_t(d)], 0));
    issue(st, sm);
    done[i] = events.make();
    CUDA_CHECK(cudaEventRecord(done[i], sm));
  }
  if (comm != o.stream) {
    cudaEvent_t end = events.make();
    CUDA_CHECK(cudaEventRecord(end, comm));
    CUDA_CHECK(cudaStreamWaitEvent(o.stream, end, 0));
  }
}

// The expert FFN of one chunk on the compute stream, from its received rows xr to its outputs ye_src (source-major, as
// they go back): under ETP the rows of every ETP rank gathered first and the partial outputs reduce-scattered after.
void expert_fwd(DeviceOps& o, const Ctx& c, const DevMoeWeights& W, DevChunk& b, int64_t H, int64_t F) {
  const int64_t rows = b.rows_in();
  if (c.pg.etp.size > 1) {  // every ETP rank's received rows: each runs its FFN columns on all of them
    DeviceBuf<float> all = o.ws(size_t(rows * H));
    etp_gather(c, b, b.xr.data(), all.data(), H);
    reorder(o, b, all.data(), b.xe.data(), H, true);
  } else {
    reorder(o, b, b.xr.data(), b.xe.data(), H, true);
  }
  expert_gemms(o, b, b.xe.data(), H, 2 * F, W.w1.data(), b.h1.data(), false);
  mg::launch_swiglu<float>(b.h1.data(), rows, int(F), b.act.data(), o.stream);
  DeviceBuf<float> ye = o.ws(size_t(rows * H));
  expert_gemms(o, b, b.act.data(), F, H, W.w2.data(), ye.data(), false);
  if (c.pg.etp.size > 1) {  // partial outputs over this rank's columns, summed back to the ranks that received
    DeviceBuf<float> by_rank = o.ws(size_t(rows * H));
    reorder(o, b, ye.data(), by_rank.data(), H, false);
    etp_reduce_scatter(o, c, b, by_rank.data(), b.ye_src.data(), H);
  } else {
    reorder(o, b, ye.data(), b.ye_src.data(), H, false);
  }
}

// Its backward (dgrad) from the received output gradients dyr to the input gradients dx_src: dye and dh1 are kept for
// the delayed weight gradient.
void expert_dgrad(DeviceOps& o, const Ctx& c, const DevMoeWeights& W, DevChunk& b, const float* dyr, float* dye,
                  float* dh1, float* dx_src, int64_t H, int64_t F) {
  const int64_t rows = b.rows_in();
  if (c.pg.etp.size > 1) {  // the output gradient of every ETP rank's rows: each rank's columns need all of them
    DeviceBuf<float> all = o.ws(size_t(rows * H));
    etp_gather(c, b, dyr, all.data(), H);
    reorder(o, b, all.data(), dye, H, true);
  } else {
    reorder(o, b, dyr, dye, H, true);
  }
  DeviceBuf<float> dact = o.ws(size_t(rows * F)), dxe = o.ws(size_t(rows * H));
  expert_gemms(o, b, dye, H, F, W.w2.data(), dact.data(), true);
  mg::launch_swiglu_bwd<float>(b.h1.data(), dact.data(), rows, int(F), dh1, o.stream);
  expert_gemms(o, b, dh1, 2 * F, H, W.w1.data(), dxe.data(), true);
  if (c.pg.etp.size > 1) {  // partial input gradients over this rank's columns, summed back
    DeviceBuf<float> by_rank = o.ws(size_t(rows * H));
    reorder(o, b, dxe.data(), by_rank.data(), H, false);
    etp_reduce_scatter(o, c, b, by_rank.data(), dx_src, H);
  } else {
    reorder(o, b, dxe.data(), dx_src, H, false);
  }
}

}  // namespace

void DeviceOps::moe_fwd(Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep,
                        DeviceLayerSaved& sv, float* y) {
  const moe::MoeConfig& cfg = c.d.moe;
  const int64_t R = c.rows, H = cfg.hidden, E = cfg.experts, K = cfg.top_k, F = cfg.expert_ffn / c.pg.etp.size,
                S = c.d.shared_local;
  check_args(c, R);
  const DevMoeWeights W = widen_weights(*this, c, u, w);
  DeviceBuf<float> logits(tr, Category::MoeBuffers, size_t(R * E));
  gemm32(*this, false, false, R, E, H, n2, W.router.data(), logits.data(), 0.0f);
  DevRouting rt = route(*this, c, W, logits.data(), nullptr);
  for (DevChunk& b : rt.chunks) {  // every buffer of the pass, before it starts (run_steps)
    const size_t slots = size_t(b.tokens()) * size_t(K), rows = size_t(b.rows_in()), got = size_t(b.lay.rows_received);
    for (auto [buf, n] : {std::pair{&b.xp, slots * H}, {&b.xr, got * H}, {&b.xe, rows * H}, {&b.h1, rows * 2 * F},
                          {&b.act, rows * F}, {&b.ye_src, got * H}, {&b.yp, slots * H}})
      *buf = DeviceBuf<float>(tr, Category::MoeBuffers, n);
  }
  DevShared sh;
  if (S && !c.sched.shared_expert) shared_fwd(*this, c, W, n2, sh);  // under TP the schedule has no shared step
  comm::Comm ep = c.pg.ep;
  run_steps(*this, c.sched.forward, [&](const moe::Step& st, cudaStream_t sm) {
    ep.stream = sm;
    DevChunk* b = st.chunk >= 0 ? &rt.chunks[size_t(st.chunk)] : nullptr;
    switch (st.op) {
      case moe::StepOp::Route:
      case moe::StepOp::Counts:
        break;  // route() did both before the pass: the all-to-alls need their counts on the host
      case moe::StepOp::Permute:
        mg::launch_permute<float>(n2 + b->t0 * H, b->rows.data(), b->tokens(), int(K), int(H), b->xp.data(), sm);
        break;
      case moe::StepOp::Dispatch:
        comm::all_to_all_v(ep, b->xp.data(), b->lay.send_counts.data(), b->lay.send_displs.data(), b->xr.data(),
                           b->lay.recv_counts.data(), b->lay.recv_displs.data(), comm::DType::F32);
        break;
      case moe::StepOp::SharedFwd:
        if (S) shared_fwd(*this, c, W, n2, sh);
        break;
      case moe::StepOp::ExpertFwd:
        expert_fwd(*this, c, W, *b, H, F);
        break;
      case moe::StepOp::Combine:  // the dispatch's reverse route
        comm::all_to_all_v(ep, b->ye_src.data(), b->lay.recv_counts.data(), b->lay.recv_displs.data(), b->yp.data(),
                           b->lay.send_counts.data(), b->lay.send_displs.data(), comm::DType::F32);
        break;
      case moe::StepOp::Unpermute:
        mg::launch_unpermute<float>(b->yp.data(), b->rows.data(), rt.w.data() + b->t0 * K, b->tokens(), int(K), int(H),
                                    S ? sh.out.data() + b->t0 * H : nullptr,
                                    S && c.d.shared_gate ? sh.gate.data() + b->t0 : nullptr, y + b->t0 * H, sm);
        break;
      default:
        throw std::logic_error(std::string("MoE forward schedule has a backward step: ") + moe::op_name(st.op));
    }
  });
  round(y, size_t(R * H));
  if (keep == Keep::InputOnly) return;
  c.moe_rows_received += double(rt.rows_received);
  c.moe_rows_sent += double(R) * double(K);
  sv.logits = save32(logits.data(), logits.size());
  sv.probs = save32(rt.scores.data(), rt.scores.size());
  sv.xe = concat16(*this, rt.chunks, [](DevChunk& k) -> DeviceBuf<float>& { return k.xe; });
  sv.yp = concat16(*this, rt.chunks, [](DevChunk& k) -> DeviceBuf<float>& { return k.yp; });
  sv.h1 = concat16(*this, rt.chunks, [](DevChunk& k) -> DeviceBuf<float>& { return k.h1; });
  // SwiGLU of the saved (rounded) fc1 outputs, as on the host: every recompute mode backpropagates the same values.
  if (keep == Keep::All) sv.eact = impl::swiglu16(*this, sv.h1, F);
  if (S) {
    sv.sh1 = save16(sh.h1.data(), sh.h1.size());
    if (keep == Keep::All) sv.sact = impl::swiglu16(*this, sv.sh1, S);
  }
  // From pageable memory: staged before the call returns, so the vector may go with rt.
  sv.moe_meta = DeviceBuf<int64_t>(tr, Category::Activations, rt.meta.size());
  CUDA_CHECK(cudaMemcpyAsync(sv.moe_meta.data(), rt.meta.data(), sizeof(int64_t) * rt.meta.size(),
                             cudaMemcpyHostToDevice, stream));
}

void DeviceOps::moe_bwd(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, DeviceLayerSaved& sv,
                        const float* n2, const float* dy, float* dn2) {
  const moe::MoeConfig& cfg = c.d.moe;
  const int64_t R = c.rows, H = cfg.hidden, E = cfg.experts, K = cfg.top_k, F = cfg.expert_ffn / c.pg.etp.size,
                S = c.d.shared_local;
  check_args(c, R);
  const DevMoeWeights W = widen_weights(*this, c, u, w);
  // The forward's routing, rebuilt from its saved logits and receive counts (the host's restore_routing).
  std::vector<int64_t> recv(sv.moe_meta.size());
  CUDA_CHECK(cudaMemcpyAsync(recv.data(), sv.moe_meta.data(), sizeof(int64_t) * recv.size(), cudaMemcpyDeviceToHost,
                             stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  DevRouting rt = route(*this, c, W, sv.logits.data(), recv.data());
  size_t xe_at = 0, h1_at = 0, act_at = 0, yp_at = 0;
  for (DevChunk& b : rt.chunks) {
    const size_t rows = size_t(b.rows_in()), slots = size_t(b.tokens()) * size_t(K);
    b.xe = take(*this, sv.xe, xe_at, rows * H);
    b.h1 = take(*this, sv.h1, h1_at, rows * 2 * F);
    b.act = take(*this, sv.eact, act_at, rows * F);
    b.yp = take(*this, sv.yp, yp_at, slots * H);
  }
  DevShared sh;
  if (S) {  // the shared expert's output recomputed from the saved activation (not saved itself), as on the host
    size_t at = 0;
    sh.h1 = take(*this, sv.sh1, at, sv.sh1.size());
    at = 0;
    sh.act = take(*this, sv.sact, at, sv.sact.size());
    shared_out(*this, c, W, n2, sh);
  }
  DeviceBuf<float> dw(tr, Category::MoeBuffers, size_t(R * K)), dx_routed(tr, Category::MoeBuffers, size_t(R * H)),
      dx_shared(tr, Category::MoeBuffers, size_t(R * H));
  // The gradients' buffers per chunk, before the pass starts (run_steps).
  const size_t N = rt.chunks.size();
  std::vector<DeviceBuf<float>> dyp(N), dyr(N), dye(N), dh1(N), dx_src(N), dxp(N);
  for (size_t ch = 0; ch < N; ++ch) {
    const DevChunk& b = rt.chunks[ch];
    const size_t slots = size_t(b.tokens()) * size_t(K), rows = size_t(b.rows_in()), got = size_t(b.lay.rows_received);
    for (auto [buf, n] : {std::pair{&dyp[ch], slots * H}, {&dyr[ch], got * H}, {&dye[ch], rows * H},
                          {&dh1[ch], rows * 2 * F}, {&dx_src[ch], got * H}, {&dxp[ch], slots * H}})
      *buf = DeviceBuf<float>(tr, Category::MoeBuffers, n);
  }
  if (S && !c.sched.shared_expert) shared_bwd(*this, c, u, g, W, sh, n2, dy, dx_shared.data());  // TP: no step
  comm::Comm ep = c.pg.ep;
  run_steps(*this, c.sched.backward, [&](const moe::Step& st, cudaStream_t sm) {
    ep.stream = sm;
    const size_t ch = st.chunk >= 0 ? size_t(st.chunk) : 0;
    DevChunk& b = rt.chunks[ch];
    switch (st.op) {
      case moe::StepOp::UnpermuteBwd:
        mg::launch_unpermute_bwd<float>(dy + b.t0 * H, b.yp.data(), b.rows.data(), rt.w.data() + b.t0 * K, b.tokens(),
                                        int(K), int(H), dyp[ch].data(), dw.data() + b.t0 * K, sm);
        break;
      case moe::StepOp::CombineBwd:  // output gradients travel the dispatch route
        comm::all_to_all_v(ep, dyp[ch].data(), b.lay.send_counts.data(), b.lay.send_displs.data(), dyr[ch].data(),
                           b.lay.recv_counts.data(), b.lay.recv_displs.data(), comm::DType::F32);
        break;
      case moe::StepOp::SharedBwd:
        if (S) shared_bwd(*this, c, u, g, W, sh, n2, dy, dx_shared.data());
        break;
      case moe::StepOp::ExpertDgrad:
        expert_dgrad(*this, c, W, b, dyr[ch].data(), dye[ch].data(), dh1[ch].data(), dx_src[ch].data(), H, F);
        break;
      case moe::StepOp::DispatchBwd:  // input gradients travel the combine route
        comm::all_to_all_v(ep, dx_src[ch].data(), b.lay.recv_counts.data(), b.lay.recv_displs.data(), dxp[ch].data(),
                           b.lay.send_counts.data(), b.lay.send_displs.data(), comm::DType::F32);
        break;
      case moe::StepOp::ExpertWgrad:  // delayed: every chunk's, after the last dgrad, chunk by chunk per expert
        for (size_t k = 0; k < N; ++k) {
          const DevChunk& bk = rt.chunks[k];
          const std::vector<int64_t>& off = bk.gemm.expert_off;
          for (int64_t e = 0; e + 1 < int64_t(off.size()); ++e) {
            const int64_t r0 = off[size_t(e)], m = off[size_t(e) + 1] - r0;
            if (!m) continue;
            gemm32(*this, true, false, F, H, m, bk.act.data() + r0 * F, dye[k].data() + r0 * H,
                   g.expert + u.off.w2 + e * F * H, 1.0f);
            gemm32(*this, true, false, H, 2 * F, m, bk.xe.data() + r0 * H, dh1[k].data() + r0 * 2 * F,
                   g.expert + u.off.w1 + e * H * 2 * F, 1.0f);
          }
        }
        break;
      case moe::StepOp::PermuteBwd:  // each token's K slot gradients summed in k order (weights 1)
        mg::launch_unpermute<float>(dxp[ch].data(), b.rows.data(), nullptr, b.tokens(), int(K), int(H), nullptr,
                                    nullptr, dx_routed.data() + b.t0 * H, sm);
        break;
      case moe::StepOp::RouterBwd: {
        // dlogits from the routing weights' gradients and the saved probabilities; the expert bias takes no gradient.
        DeviceBuf<float> dlogits = ws(size_t(R * E));
        mg::launch_route_bwd(sv.probs.data(), rt.idx.data(), dw.data(), moe::router_params(cfg), int(R),
                             dlogits.data(), sm);
        gemm32(*this, true, false, H, E, R, n2, dlogits.data(), impl::gd(g, u.off.router), 1.0f);
        mg::launch_add(dx_routed.data(), dx_shared.data(), R * H, dn2, sm);
        gemm32(*this, false, true, R, H, E, dlogits.data(), W.router.data(), dn2, 1.0f);
        break;
      }
      default:
        throw std::logic_error(std::string("MoE backward schedule has a forward step: ") + moe::op_name(st.op));
    }
  });
}

}  // namespace lcplan::exec::cuda
