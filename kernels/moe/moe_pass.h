// One pass of the chunked expert-parallel MoE layer, once for every backend: the CPU layer (moe_cpu.h) and
// lcplan-exec's MoE FFN on the host and on the GPU (executor/layers/moe.h) run these templates; what a step runs on is
// the `Ops` argument. Routing and the all-to-all sizes come first (route, plan_chunks: the counts the host needs to
// size every all-to-all and GEMM), then the schedule's steps (parallel/chunk_schedule.h) run on the ops' two streams:
// permute -> dispatch -> expert SwiGLU FFN -> combine -> unpermute per chunk, plus the shared expert; backward with
// per-chunk dgrad and one delayed wgrad that sums each expert's rows in the unchunked order. With the CPU ops'
// fixed-order GEMMs every output row and gradient is bit-identical for every chunk count.
//
// Expert tensor parallelism (etp): after the EP dispatch the rows an expert received are all-gathered over ETP, every
// ETP rank runs its FFN columns on all of them, and the partial outputs are reduce-scattered back, summed in ETP-rank
// order. The shared expert under tensor parallelism (tp, Megatron's SharedExpertMLP with sequence parallelism): fc1
// column-parallel on the tokens all-gathered over tp, fc2 row-parallel reduce-scattered back; router and routed experts
// see this rank's rows.
//
// An Ops `o` offers (pointers in the backend's memory, sizes in elements; moe_ops_cpu.h, executor/layers_cuda.h):
//   template <class T> using Buf;  moe_buf<T>(n)  ws(n)  upload(vector<int64_t>)   the layer's state (zeroed), fp32
//                                                                                  scratch, host values copied in
//   gemm32(A, B, C, rows, k, n), gemm32_bt, gemm32_at                              C = A B, C = A B^T, G += A^T D
//   route, route_bwd, chunk_counts (returned to the host), expert_major_rows, permute, unpermute, unpermute_bwd,
//   swiglu, swiglu_bwd, add, copy_blocks, shared_gate, shared_gate_bwd            moe_kernels_cpu.h / _cuda.h
//   run_steps(steps, issue)        issues a step list: compute steps in order on the compute stream, comm steps on
//                                  the comm stream, each after its dependencies
//   all_to_all_step(comm, ...)     the schedule's all-to-all, from inside a comm step of run_steps
// Other collectives (ETP, the shared expert's tp) are blocking comm:: calls on the groups' own streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_math.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::moe {

// One call of the layer: its configuration (shared_ffn: the shared expert's columns on this rank), schedule, groups
// (a size-1 etp or tp: none) and this rank's rows, the router's and the routed experts'.
struct MoeCall {
  const MoeConfig& cfg;
  const ChunkSchedule& sched;
  const comm::Comm& ep;
  const comm::Comm& etp;
  const comm::Comm& tp;
  int tokens = 0;
  int local_experts() const { return cfg.experts / ep.size; }
  int ffn() const { return cfg.expert_ffn / etp.size; }  // FFN columns of each routed expert on this rank
};

// The collective argument check of a call (check_moe_args on this rank's shard shape): every rank of ep and etp throws
// the same std::invalid_argument on bad input.
inline void check_call(const MoeCall& a) {
  MoeWeights shape;
  shape.local_experts = a.local_experts();
  shape.first_expert = a.ep.rank * shape.local_experts;
  shape.ffn_local = a.ffn();
  check_moe_args(a.ep, a.etp, a.cfg, shape, a.tokens, a.sched);
}

// This rank's fp32 weights (moe_layer.h MoeWeights' layout; bias null: none, shared null when shared_ffn is 0).
struct MoeParams {
  const float *router = nullptr, *bias = nullptr, *w1 = nullptr, *w2 = nullptr;
  const float *shared_w1 = nullptr, *shared_w2 = nullptr, *shared_gate = nullptr;
};
// Their gradients, accumulated into (the expert bias is steered by balancing, not by gradient).
struct MoeGrads {
  float *router = nullptr, *w1 = nullptr, *w2 = nullptr, *shared_w1 = nullptr, *shared_w2 = nullptr,
        *shared_gate = nullptr;
};

// One chunk of the schedule: its tokens, its all-to-all layout, the rows its expert GEMMs run on (every ETP rank's
// received rows under ETP) and its state.
template <class Ops>
struct MoeChunk {
  template <class T>
  using Buf = typename Ops::template Buf<T>;
  int t0 = 0, t1 = 0;
  ChunkLayout lay;                 // the EP all-to-all's counts and displacements (moe_layer.h chunk_layout)
  std::vector<int64_t> by_block;   // rows per (ETP rank, source, local expert) of the GEMMs (lay.recv_by_block
                                   // without ETP)
  std::vector<int64_t> peer_rows;  // rows each ETP rank received (ETP only)
  BlockTable gemm;                 // block_table(by_block): source-major <-> expert-major
  Buf<int> rows;                   // slot (t - t0) * K + k -> its row of xp / yp (stable, expert-major)
  Buf<int64_t> blocks;             // gemm.blocks where copy_blocks reads them
  Buf<float> xp, xr, xe, h1, act, ye_src, yp;  // forward: permuted, received, expert-major, fc1, SwiGLU, out, back
  Buf<float> dyp, dyr, dye, dh1, dx_src, dxp;  // backward
  int tokens() const { return t1 - t0; }
};

// The layer's state from the forward to the backward: every buffer of the pass, owned here.
template <class Ops>
struct MoeState {
  template <class T>
  using Buf = typename Ops::template Buf<T>;
  int tokens = 0;
  Buf<float> scores, w;  // [tokens x experts] softmax or sigmoid scores, [tokens x top_k] routing weights
  Buf<int> idx;          // [tokens x top_k] chosen experts
  std::vector<int64_t> counts_send, counts_recv;  // [peer][chunk][local expert]
  std::vector<int64_t> counts_recv_etp;           // ETP: every ETP rank's counts_recv, ETP rank by ETP rank
  Buf<float> sh1, sact, sout, sgate;              // shared expert: fc1 and SwiGLU (all tp ranks' tokens), out, gate
  std::vector<MoeChunk<Ops>> chunks;
  Buf<float> dw, dx_routed, dx_shared;
  int64_t gemm_rows() const {  // rows of this rank's expert GEMMs over every chunk
    int64_t n = 0;
    for (const auto& b : chunks) n += b.gemm.rows();
    return n;
  }
};

// ---------------------------------------------------------------- tensor-parallel rows

// A [rows * tp x w] tensor: this rank's rows all-gathered over tp, or (tp of one) the rows themselves, not copied.
template <class Ops>
struct GatheredRows {
  typename Ops::template Buf<float> buf;
  const float* p = nullptr;
};
template <class Ops>
GatheredRows<Ops> gather_rows(Ops& o, const comm::Comm& tp, const float* mine, int64_t rows, int64_t w) {
  if (tp.size == 1) return {{}, mine};
  GatheredRows<Ops> r{o.ws(size_t(rows * tp.size * w)), nullptr};
  comm::all_gather(tp, mine, r.buf.data(), size_t(rows * w), comm::DType::F32);
  r.p = r.buf.data();
  return r;
}

// ---------------------------------------------------------------- routing and the chunks' layouts

template <class Ops>
void router_logits(Ops& o, const MoeCall& a, const MoeParams& p, const float* x, float* logits) {
  o.gemm32(x, p.router, logits, a.tokens, a.cfg.hidden, a.cfg.experts);
}

// Scores, chosen experts and routing weights of every token from the router's logits.
template <class Ops>
void route(Ops& o, const MoeCall& a, const MoeParams& p, const float* logits, MoeState<Ops>& st) {
  const size_t T = size_t(a.tokens), E = size_t(a.cfg.experts), K = size_t(a.cfg.top_k);
  st.tokens = a.tokens;
  st.scores = o.template moe_buf<float>(T * E);
  st.idx = o.template moe_buf<int>(T * K);
  st.w = o.template moe_buf<float>(T * K);
  o.route(logits, p.bias, router_params(a.cfg), a.tokens, st.scores.data(), st.idx.data(), st.w.data());
}

// Every ETP rank's receive counts: an exchange of ETP copies of this rank's is their all-gather (host counts on every
// backend).
inline std::vector<int64_t> etp_counts(const comm::Comm& etp, const std::vector<int64_t>& recv) {
  const size_t n = recv.size(), Q = size_t(etp.size);
  std::vector<size_t> copies(n * Q), all(n * Q);
  for (size_t q = 0; q < Q; ++q) std::copy(recv.begin(), recv.end(), copies.begin() + ptrdiff_t(q * n));
  comm::exchange_counts(etp, copies.data(), all.data(), n);
  return std::vector<int64_t>(all.begin(), all.end());
}

// The chunks of the routed tokens: token ranges, what each rank sends and receives per (peer, chunk, local expert),
// every chunk's all-to-all layout, GEMM rows and stable expert-major slot rows. exchange: the receive counts come
// from the peers (forward); else st.counts_recv (and counts_recv_etp) already hold the forward's (a rebuild).
template <class Ops>
void plan_chunks(Ops& o, const MoeCall& a, MoeState<Ops>& st, bool exchange) {
  const int P = a.ep.size, Q = a.etp.size, N = a.sched.chunks, L = a.local_experts(), E = a.cfg.experts,
            K = a.cfg.top_k;
  const std::vector<int> bounds = chunk_bounds(st.tokens, N, a.sched.weights);
  const std::vector<int> counts = o.chunk_counts(st.idx.data(), K, E, bounds);  // [chunk][expert]
  st.counts_send.assign(size_t(P) * N * L, 0);
  for (int q = 0; q < P; ++q)
    for (int ch = 0; ch < N; ++ch)
      for (int e = 0; e < L; ++e) st.counts_send[(size_t(q) * N + ch) * L + e] = counts[size_t(ch) * E + q * L + e];
  if (exchange) {
    std::vector<size_t> send(st.counts_send.begin(), st.counts_send.end()), recv(send.size());
    comm::exchange_counts(a.ep, send.data(), recv.data(), size_t(N) * L);
    st.counts_recv.assign(recv.begin(), recv.end());
    if (Q > 1) st.counts_recv_etp = etp_counts(a.etp, st.counts_recv);
  }
  st.chunks.resize(size_t(N));
  for (int ch = 0; ch < N; ++ch) {
    MoeChunk<Ops>& b = st.chunks[size_t(ch)];
    b.t0 = bounds[size_t(ch)];
    b.t1 = bounds[size_t(ch) + 1];
    b.lay = chunk_layout(st.counts_send, st.counts_recv, P, a.ep.rank, N, L, a.cfg.hidden, ch);
    b.by_block = Q > 1 ? etp_by_block(st.counts_recv_etp, Q, P, N, L, ch) : b.lay.recv_by_block;
    if (Q > 1) b.peer_rows = etp_rows(b.by_block, Q, P, L);
    b.gemm = block_table(b.by_block, P * Q, L);
    b.blocks = o.upload(b.gemm.blocks);
    b.rows = o.template moe_buf<int>(size_t(b.tokens()) * K);
    if (b.tokens()) o.expert_major_rows(st.idx.data() + size_t(b.t0) * K, b.tokens() * K, E, b.rows.data());
  }
}

// ---------------------------------------------------------------- the expert FFN of one chunk

// One GEMM per local expert with rows: out rows [off[e], off[e+1]) = in rows x W_e (W_e = w + e k n, k x n; or n x k
// with trans_w).
template <class Ops>
void expert_gemms(Ops& o, const MoeChunk<Ops>& b, const float* in, int64_t k, int64_t n, const float* w, float* out,
                  bool trans_w) {
  const std::vector<int64_t>& off = b.gemm.expert_off;
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int64_t r0 = off[e], m = off[e + 1] - r0;
    if (!m) continue;
    if (trans_w) o.gemm32_bt(in + r0 * k, w + int64_t(e) * k * n, out + r0 * n, m, k, n);
    else o.gemm32(in + r0 * k, w + int64_t(e) * k * n, out + r0 * n, m, k, n);
  }
}

// Received rows (source-major) to the expert-major rows of the GEMMs: under ETP every ETP rank's received rows,
// gathered in ETP-rank order first (Megatron gather_from_sequence_parallel_region over the expert-TP group).
template <class Ops>
void to_expert_major(Ops& o, const MoeCall& a, const MoeChunk<Ops>& b, const float* received, float* out) {
  const int64_t H = a.cfg.hidden;
  const float* in = received;
  typename Ops::template Buf<float> all;
  if (a.etp.size > 1) {
    const size_t Q = size_t(a.etp.size);
    std::vector<size_t> sc(Q, size_t(b.lay.rows_received * H)), sd(Q, 0), rc(Q), rd(Q);
    for (size_t q = 0, at = 0; q < Q; at += rc[q], ++q) {
      rc[q] = size_t(b.peer_rows[q] * H);
      rd[q] = at;
    }
    all = o.ws(size_t(b.gemm.rows() * H));
    comm::all_to_all_v(a.etp, received, sc.data(), sd.data(), all.data(), rc.data(), rd.data(), comm::DType::F32);
    in = all.data();
  }
  o.copy_blocks(in, out, b.blocks.data(), b.gemm.nblocks(), b.gemm.max_block_rows, int(H), true);
}

// Expert-major GEMM output rows back to the rows this rank received (source-major): under ETP the partial sums over
// this rank's FFN columns reduce-scattered back to the ranks that received them, summed in ETP-rank order.
template <class Ops>
void from_expert_major(Ops& o, const MoeCall& a, const MoeChunk<Ops>& b, const float* in, float* back) {
  const int64_t H = a.cfg.hidden;
  if (a.etp.size == 1) return o.copy_blocks(in, back, b.blocks.data(), b.gemm.nblocks(), b.gemm.max_block_rows,
                                            int(H), false);
  typename Ops::template Buf<float> by_rank = o.ws(size_t(b.gemm.rows() * H));
  o.copy_blocks(in, by_rank.data(), b.blocks.data(), b.gemm.nblocks(), b.gemm.max_block_rows, int(H), false);
  const size_t Q = size_t(a.etp.size), mine = size_t(b.lay.rows_received * H);
  std::vector<size_t> sc(Q), sd(Q), rc(Q, mine), rd(Q);
  for (size_t q = 0, at = 0; q < Q; at += sc[q], ++q) {
    sc[q] = size_t(b.peer_rows[q] * H);
    sd[q] = at;
    rd[q] = q * mine;
  }
  typename Ops::template Buf<float> got = o.ws(Q * mine);
  comm::all_to_all_v(a.etp, by_rank.data(), sc.data(), sd.data(), got.data(), rc.data(), rd.data(), comm::DType::F32);
  for (size_t q = 0; q < Q; ++q) o.add(back, got.data() + q * mine, int64_t(mine), back);  // back starts zeroed
}

template <class Ops>
void expert_fwd(Ops& o, const MoeCall& a, const MoeParams& p, MoeChunk<Ops>& b) {
  const int64_t H = a.cfg.hidden, F = a.ffn(), rows = b.gemm.rows();
  to_expert_major(o, a, b, b.xr.data(), b.xe.data());
  expert_gemms(o, b, b.xe.data(), H, 2 * F, p.w1, b.h1.data(), false);
  o.swiglu(b.h1.data(), rows, int(F), b.act.data());
  typename Ops::template Buf<float> ye = o.ws(size_t(rows * H));
  expert_gemms(o, b, b.act.data(), F, H, p.w2, ye.data(), false);
  from_expert_major(o, a, b, ye.data(), b.ye_src.data());
}

// Its backward (dgrad) from the received output gradients dyr to the input gradients dx_src; dye and dh1 stay for
// the delayed weight gradient.
template <class Ops>
void expert_dgrad(Ops& o, const MoeCall& a, const MoeParams& p, MoeChunk<Ops>& b) {
  const int64_t H = a.cfg.hidden, F = a.ffn(), rows = b.gemm.rows();
  to_expert_major(o, a, b, b.dyr.data(), b.dye.data());
  typename Ops::template Buf<float> dact = o.ws(size_t(rows * F)), dxe = o.ws(size_t(rows * H));
  expert_gemms(o, b, b.dye.data(), H, F, p.w2, dact.data(), true);
  o.swiglu_bwd(b.h1.data(), dact.data(), rows, int(F), b.dh1.data());
  expert_gemms(o, b, b.dh1.data(), 2 * F, H, p.w1, dxe.data(), true);
  from_expert_major(o, a, b, dxe.data(), b.dx_src.data());
}

// The delayed wgrad of every chunk: expert e's rows summed (ETP rank, source) block by block, chunk by chunk, the
// unchunked buffer's order (each source's rows are in token order and chunks are consecutive token ranges), so the
// sums are bit-identical to no-chunk where the GEMMs sum in a fixed order.
template <class Ops>
void expert_wgrad(Ops& o, const MoeCall& a, const MoeGrads& g, const MoeState<Ops>& st) {
  const int64_t H = a.cfg.hidden, F = a.ffn();
  const int L = a.local_experts(), PQ = a.ep.size * a.etp.size;
  for (int e = 0; e < L; ++e)
    for (int q = 0; q < PQ; ++q)
      for (const MoeChunk<Ops>& b : st.chunks) {
        const int64_t n = b.by_block[size_t(q) * L + e];
        if (!n) continue;
        const int64_t r0 = block_offset_expert_major(b.by_block.data(), PQ, L, q, e);
        o.gemm32_at(b.act.data() + r0 * F, b.dye.data() + r0 * H, g.w2 + e * F * H, n, F, H);
        o.gemm32_at(b.xe.data() + r0 * H, b.dh1.data() + r0 * 2 * F, g.w1 + e * H * 2 * F, n, H, 2 * F);
      }
}

// ---------------------------------------------------------------- the shared expert

// out and gate from the SwiGLU activation (the forward's last part, and a rebuild's: the output is not kept).
template <class Ops>
void shared_out(Ops& o, const MoeCall& a, const MoeParams& p, MoeState<Ops>& st, const float* x) {
  const int64_t R = a.tokens, T = R * a.tp.size, H = a.cfg.hidden, S = a.cfg.shared_ffn;
  st.sout = o.template moe_buf<float>(size_t(R * H));
  if (a.tp.size == 1) {
    o.gemm32(st.sact.data(), p.shared_w2, st.sout.data(), R, S, H);
  } else {
    typename Ops::template Buf<float> partial = o.ws(size_t(T * H));
    o.gemm32(st.sact.data(), p.shared_w2, partial.data(), T, S, H);
    comm::reduce_scatter(a.tp, partial.data(), st.sout.data(), size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
  }
  if (!a.cfg.shared_gate) return;
  st.sgate = o.template moe_buf<float>(size_t(R));
  o.shared_gate(x, p.shared_gate, int(R), int(H), st.sgate.data());
}

template <class Ops>
void shared_fwd(Ops& o, const MoeCall& a, const MoeParams& p, MoeState<Ops>& st, const float* x) {
  const int64_t T = int64_t(a.tokens) * a.tp.size, H = a.cfg.hidden, S = a.cfg.shared_ffn;
  st.sh1 = o.template moe_buf<float>(size_t(T * 2 * S));
  st.sact = o.template moe_buf<float>(size_t(T * S));
  o.gemm32(gather_rows(o, a.tp, x, a.tokens, H).p, p.shared_w1, st.sh1.data(), T, H, 2 * S);
  o.swiglu(st.sh1.data(), T, int(S), st.sact.data());
  shared_out(o, a, p, st, x);
}

// Its backward: the gate's and both GEMMs' weight gradients, the input gradient into st.dx_shared.
template <class Ops>
void shared_bwd(Ops& o, const MoeCall& a, const MoeParams& p, const MoeGrads& g, MoeState<Ops>& st, const float* x,
                const float* dout) {
  using Buf = typename Ops::template Buf<float>;
  const int64_t R = a.tokens, T = R * a.tp.size, H = a.cfg.hidden, S = a.cfg.shared_ffn;
  Buf dso = o.ws(size_t(R * H)), dz = o.ws(size_t(R));
  o.shared_gate_bwd(dout, st.sout.data(), a.cfg.shared_gate ? st.sgate.data() : nullptr, int(R), int(H), dso.data(),
                    dz.data());
  if (a.cfg.shared_gate) {  // the gate's rank-1 products: x^T dz into its gradient, dz g into the input gradient
    o.gemm32_at(x, dz.data(), g.shared_gate, R, H, 1);
    o.gemm32(dz.data(), p.shared_gate, st.dx_shared.data(), R, 1, H);
  }
  Buf dsh1 = o.ws(size_t(T * 2 * S));
  {
    const GatheredRows<Ops> dso_all = gather_rows(o, a.tp, dso.data(), R, H);
    o.gemm32_at(st.sact.data(), dso_all.p, g.shared_w2, T, S, H);
    Buf dsact = o.ws(size_t(T * S));
    o.gemm32_bt(dso_all.p, p.shared_w2, dsact.data(), T, H, S);
    o.swiglu_bwd(st.sh1.data(), dsact.data(), T, int(S), dsh1.data());
  }
  o.gemm32_at(gather_rows(o, a.tp, x, R, H).p, dsh1.data(), g.shared_w1, T, H, 2 * S);
  Buf dx = o.ws(size_t(T * H));
  o.gemm32_bt(dsh1.data(), p.shared_w1, dx.data(), T, 2 * S, H);
  if (a.tp.size > 1) {  // partial sums over this rank's columns, this rank's rows summed over tp
    Buf mine = o.ws(size_t(R * H));
    comm::reduce_scatter(a.tp, dx.data(), mine.data(), size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
    dx = std::move(mine);
  }
  o.add(st.dx_shared.data(), dx.data(), R * H, st.dx_shared.data());
}

// ---------------------------------------------------------------- the passes

// One forward step of the schedule (route and plan_chunks ran the Route and Counts steps' work before the pass).
template <class Ops>
void forward_step(Ops& o, const MoeCall& a, const MoeParams& p, MoeState<Ops>& st, const float* x, float* out,
                  const Step& s) {
  const int H = a.cfg.hidden, K = a.cfg.top_k;
  const bool shared = a.cfg.shared_ffn > 0;
  MoeChunk<Ops>* b = s.chunk >= 0 ? &st.chunks[size_t(s.chunk)] : nullptr;
  const ChunkLayout* l = b ? &b->lay : nullptr;
  switch (s.op) {
    case StepOp::Route:
    case StepOp::Counts:
      return;
    case StepOp::Permute:
      return o.permute(x + size_t(b->t0) * H, b->rows.data(), b->tokens(), K, H, b->xp.data());
    case StepOp::Dispatch:
      return o.all_to_all_step(a.ep, b->xp.data(), l->send_counts.data(), l->send_displs.data(), b->xr.data(),
                               l->recv_counts.data(), l->recv_displs.data());
    case StepOp::SharedFwd:
      if (shared) shared_fwd(o, a, p, st, x);
      return;
    case StepOp::ExpertFwd:
      return expert_fwd(o, a, p, *b);
    case StepOp::Combine:  // the dispatch's reverse route
      return o.all_to_all_step(a.ep, b->ye_src.data(), l->recv_counts.data(), l->recv_displs.data(), b->yp.data(),
                               l->send_counts.data(), l->send_displs.data());
    case StepOp::Unpermute:
      return o.unpermute(b->yp.data(), b->rows.data(), st.w.data() + size_t(b->t0) * K, b->tokens(), K, H,
                         shared ? st.sout.data() + size_t(b->t0) * H : nullptr,
                         shared && a.cfg.shared_gate ? st.sgate.data() + b->t0 : nullptr, out + size_t(b->t0) * H);
    default:
      throw std::logic_error(std::string("MoE forward schedule has a backward step: ") + op_name(s.op));
  }
}

// out [tokens x hidden] = the layer of x, after route and plan_chunks. Every buffer of the pass is made before it
// starts (the device's comm stream may only touch buffers allocated by then).
template <class Ops>
void forward(Ops& o, const MoeCall& a, const MoeParams& p, MoeState<Ops>& st, const float* x, float* out) {
  const size_t H = size_t(a.cfg.hidden), K = size_t(a.cfg.top_k), F = size_t(a.ffn());
  for (MoeChunk<Ops>& b : st.chunks) {
    const size_t slots = size_t(b.tokens()) * K, rows = size_t(b.gemm.rows()), got = size_t(b.lay.rows_received);
    for (auto [buf, n] : {std::pair{&b.xp, slots * H}, {&b.xr, got * H}, {&b.xe, rows * H}, {&b.h1, rows * 2 * F},
                          {&b.act, rows * F}, {&b.ye_src, got * H}, {&b.yp, slots * H}})
      *buf = o.template moe_buf<float>(n);
  }
  if (a.cfg.shared_ffn > 0 && !a.sched.shared_expert) shared_fwd(o, a, p, st, x);  // no shared step (tp > 1)
  o.run_steps(a.sched.forward, [&](const Step& s) { forward_step(o, a, p, st, x, out, s); });
}

template <class Ops>
void router_bwd(Ops& o, const MoeCall& a, const MoeParams& p, const MoeGrads& g, MoeState<Ops>& st, const float* x,
                float* dx) {
  const int64_t T = a.tokens, H = a.cfg.hidden, E = a.cfg.experts;
  typename Ops::template Buf<float> dlogits = o.ws(size_t(T * E)), dxr = o.ws(size_t(T * H));
  o.route_bwd(st.scores.data(), st.idx.data(), st.dw.data(), router_params(a.cfg), int(T), dlogits.data());
  o.gemm32_at(x, dlogits.data(), g.router, T, H, E);
  o.gemm32_bt(dlogits.data(), p.router, dxr.data(), T, E, H);
  o.add(st.dx_routed.data(), st.dx_shared.data(), T * H, dx);
  o.add(dx, dxr.data(), T * H, dx);
}

template <class Ops>
void backward_step(Ops& o, const MoeCall& a, const MoeParams& p, const MoeGrads& g, MoeState<Ops>& st,
                   const float* x, const float* dout, float* dx, const Step& s) {
  const int H = a.cfg.hidden, K = a.cfg.top_k;
  MoeChunk<Ops>* b = s.chunk >= 0 ? &st.chunks[size_t(s.chunk)] : nullptr;
  const ChunkLayout* l = b ? &b->lay : nullptr;
  switch (s.op) {
    case StepOp::UnpermuteBwd:
      return o.unpermute_bwd(dout + size_t(b->t0) * H, b->yp.data(), b->rows.data(), st.w.data() + size_t(b->t0) * K,
                             b->tokens(), K, H, b->dyp.data(), st.dw.data() + size_t(b->t0) * K);
    case StepOp::CombineBwd:  // output gradients travel the dispatch route
      return o.all_to_all_step(a.ep, b->dyp.data(), l->send_counts.data(), l->send_displs.data(), b->dyr.data(),
                               l->recv_counts.data(), l->recv_displs.data());
    case StepOp::SharedBwd:
      if (a.cfg.shared_ffn > 0) shared_bwd(o, a, p, g, st, x, dout);
      return;
    case StepOp::ExpertDgrad:
      return expert_dgrad(o, a, p, *b);
    case StepOp::DispatchBwd:  // input gradients travel the combine route
      return o.all_to_all_step(a.ep, b->dx_src.data(), l->recv_counts.data(), l->recv_displs.data(), b->dxp.data(),
                               l->send_counts.data(), l->send_displs.data());
    case StepOp::ExpertWgrad:  // delayed: every chunk's, after the last dgrad, while the tail dispatch-bwd flies
      return expert_wgrad(o, a, g, st);
    case StepOp::PermuteBwd:  // each token's K slot gradients summed in k order (weights 1)
      return o.unpermute(b->dxp.data(), b->rows.data(), nullptr, b->tokens(), K, H, nullptr, nullptr,
                         st.dx_routed.data() + size_t(b->t0) * H);
    case StepOp::RouterBwd:
      return router_bwd(o, a, p, g, st, x, dx);
    default:
      throw std::logic_error(std::string("MoE backward schedule has a forward step: ") + op_name(s.op));
  }
}

// dx [tokens x hidden] and the weight gradients (accumulated into g) for dout, from the forward's state (x: the
// forward's input). The router's and shared expert's gradients are this rank's partial sums over its tokens.
template <class Ops>
void backward(Ops& o, const MoeCall& a, const MoeParams& p, const MoeGrads& g, MoeState<Ops>& st, const float* x,
              const float* dout, float* dx) {
  comm::raise_if_any(a.ep, int(st.chunks.size()) == a.sched.chunks
                               ? std::string()
                               : "backward schedule has " + std::to_string(a.sched.chunks) +
                                     " chunks but the forward ran with " + std::to_string(st.chunks.size()));
  const size_t T = size_t(a.tokens), H = size_t(a.cfg.hidden), K = size_t(a.cfg.top_k), F = size_t(a.ffn());
  st.dw = o.template moe_buf<float>(T * K);
  st.dx_routed = o.template moe_buf<float>(T * H);
  st.dx_shared = o.template moe_buf<float>(T * H);
  for (MoeChunk<Ops>& b : st.chunks) {  // every buffer of the pass before it starts, as the forward's
    const size_t slots = size_t(b.tokens()) * K, rows = size_t(b.gemm.rows()), got = size_t(b.lay.rows_received);
    for (auto [buf, n] : {std::pair{&b.dyp, slots * H}, {&b.dyr, got * H}, {&b.dye, rows * H}, {&b.dh1, rows * 2 * F},
                          {&b.dx_src, got * H}, {&b.dxp, slots * H}})
      *buf = o.template moe_buf<float>(n);
  }
  if (a.cfg.shared_ffn > 0 && !a.sched.shared_expert) shared_bwd(o, a, p, g, st, x, dout);
  o.run_steps(a.sched.backward, [&](const Step& s) { backward_step(o, a, p, g, st, x, dout, dx, s); });
}

}  // namespace lcplan::moe
