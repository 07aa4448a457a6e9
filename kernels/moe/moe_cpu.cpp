// The CPU MoE layer: fixed-order fp32 GEMMs (cpu_gemm.h) and non-blocking MPI all-to-all, run by the chunk schedule.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/moe/cpu_gemm.h"
#include "kernels/moe/moe_layer.h"

namespace lcplan::moe {

using cpu::gemm_at;
using cpu::gemm_rows;
using cpu::gemm_rows_bt;
using cpu::Poll;

namespace {

void swiglu_rows(const float* h1, float* act, int64_t rows, int F) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < F; ++j) act[r * F + j] = swiglu(h1[r * 2 * F + j], h1[r * 2 * F + F + j]);
}

void swiglu_bwd_rows(const float* h1, const float* dact, float* dh1, int64_t rows, int F) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < F; ++j)
      swiglu_bwd(h1[r * 2 * F + j], h1[r * 2 * F + F + j], dact[r * F + j], &dh1[r * 2 * F + j],
                 &dh1[r * 2 * F + F + j]);
}

// Move H-wide rows between source-major (as received) and expert-major (as the grouped GEMM wants) layouts.
void reorder_rows(const int64_t* counts, int P, int L, const float* in, float* out, int H, bool to_expert_major) {
  for (int s = 0; s < P; ++s)
    for (int e = 0; e < L; ++e) {
      const int64_t n = counts[s * L + e];
      if (!n) continue;
      const int64_t src = block_offset_src_major(counts, P, L, s, e), exp = block_offset_expert_major(counts, P, L, s, e);
      const int64_t from = to_expert_major ? src : exp, to = to_expert_major ? exp : src;
      std::memcpy(out + to * H, in + from * H, sizeof(float) * static_cast<size_t>(n * H));
    }
}

// Runs a step list on two logical streams: compute steps run inline, communication steps are non-blocking
// requests polled (and the next one issued) between GEMM row blocks.
struct Runner {
  const std::vector<Step>& steps;
  const ExecOptions& opt;
  std::vector<StepTime>* times;
  std::function<comm::Request(const Step&)> start_comm;
  std::function<void(const Step&, const Poll&)> run_compute;

  void run() {
    const auto t0 = std::chrono::steady_clock::now();
    auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    const size_t n = steps.size();
    if (times) times->assign(n, StepTime{});
    std::vector<char> done(n, 0);
    std::vector<int> comm_q, comp_q;
    for (size_t i = 0; i < n; ++i) (steps[i].stream == StreamKind::Comm ? comm_q : comp_q).push_back(int(i));
    size_t ci = 0, pi = 0;
    int inflight = -1;
    comm::Request req;
    auto ready = [&](int i) {
      for (int d : steps[i].deps)
        if (!done[d]) return false;
      return true;
    };
    auto finish = [&](int i) {
      done[i] = 1;
      if (times) (*times)[i].end = now();
    };
    std::function<void()> advance = [&] {
      if (inflight >= 0) {
        if (!comm::test(req)) return;
        finish(inflight);
        inflight = -1;
        ++ci;
      }
      while (inflight < 0 && ci < comm_q.size() && ready(comm_q[ci])) {
        const int i = comm_q[ci];
        if (times) (*times)[i].start = now();
        req = start_comm(steps[i]);
        if (!opt.overlap) comm::wait(req);
        if (!comm::test(req)) {
          inflight = i;
          return;
        }
        finish(i);
        ++ci;
      }
    };
    const Poll poll = opt.overlap ? advance : Poll{};
    while (ci < comm_q.size() || pi < comp_q.size() || inflight >= 0) {
      advance();
      if (pi < comp_q.size() && ready(comp_q[pi])) {
        const int i = comp_q[pi];
        if (times) (*times)[i].start = now();
        run_compute(steps[i], poll);
        finish(i);
        ++pi;
      } else if (inflight >= 0) {
        comm::wait(req);  // nothing to compute until this lands
        finish(inflight);
        inflight = -1;
        ++ci;
      } else if (!(ci < comm_q.size() && ready(comm_q[ci]))) {
        throw std::logic_error("MoE schedule stalled: no step can run (invalid step list)");
      }
    }
  }
};

// Rows this rank's experts received for a chunk. The backward sizes its buffers from the routing state, not from the
// forward's permuted/received rows, so a caller may drop xp, xr and ye_src between the passes (lcplan-exec does).
size_t recv_rows(const ChunkBuffers& b) {
  int64_t n = 0;
  for (int64_t v : b.recv_by_block) n += v;
  return static_cast<size_t>(n);
}

// A row block below one would never advance through the GEMM rows.
std::string poll_error(const ExecOptions& o) {
  return o.poll_rows >= 1 ? "" : "ExecOptions::poll_rows = " + std::to_string(o.poll_rows) + " must be at least 1";
}

// The Permute step's send side of a chunk: expert-major rows, per-expert counts, per-peer counts and displacements.
void send_layout(ChunkBuffers& b, const int* idx, int K, int E, int P, int L, int H) {
  const int n = (b.t1 - b.t0) * K;
  std::vector<int> offsets(E + 1);
  b.row_of_slot.resize(n);
  expert_major_rows(idx + size_t(b.t0) * K, n, E, offsets.data(), b.row_of_slot.data());
  b.send_by_expert.resize(E);
  for (int e = 0; e < E; ++e) b.send_by_expert[e] = offsets[e + 1] - offsets[e];
  b.send_counts.assign(P, 0);
  b.send_displs.assign(P, 0);
  for (int q = 0; q < P; ++q) {  // experts are contiguous per rank, so expert-major is also rank-major
    b.send_displs[q] = size_t(offsets[q * L]) * H;
    b.send_counts[q] = size_t(offsets[(q + 1) * L] - offsets[q * L]) * H;
  }
}

// The Dispatch step's receive side of chunk `ch`, from the exchanged counts. Returns the rows received.
size_t recv_layout(ChunkBuffers& b, const std::vector<int64_t>& counts_recv, int P, int N, int L, int H, int ch) {
  b.recv_by_block.assign(size_t(P) * L, 0);
  b.recv_counts.assign(P, 0);
  b.recv_displs.assign(P, 0);
  size_t rows = 0;
  for (int q = 0; q < P; ++q) {
    b.recv_displs[q] = rows * H;
    for (int e = 0; e < L; ++e) {
      const int64_t n = counts_recv[(size_t(q) * N + ch) * L + e];
      b.recv_by_block[size_t(q) * L + e] = n;
      rows += n;
      b.recv_counts[q] += n * H;
    }
  }
  return rows;
}

// Rows per (ETP rank, source, local expert) of chunk `ch`: every ETP rank's receive counts, in ETP-rank order.
void etp_layout(ChunkBuffers& b, const MoeSaved& sv, int Q, int P, int N, int L, int ch) {
  b.etp_by_block = Q == 1 ? b.recv_by_block : etp_by_block(sv.counts_recv_etp, Q, P, N, L, ch);
}

// ETP all-gather of this rank's H-wide rows: every ETP rank's rows, in ETP-rank order (Megatron
// gather_from_sequence_parallel_region over the expert-TP group, with per-rank sizes).
std::vector<float> etp_gather(const comm::Comm& etp, const std::vector<float>& mine, const std::vector<int64_t>& rows,
                              int H) {
  const int Q = etp.size;
  std::vector<size_t> sc(Q, mine.size()), sd(Q, 0), rc(Q), rd(Q);
  size_t at = 0;
  for (int q = 0; q < Q; ++q) {
    rc[q] = size_t(rows[q]) * H;
    rd[q] = at;
    at += rc[q];
  }
  std::vector<float> out(at);
  comm::all_to_all_v(etp, mine.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data(), comm::DType::F32);
  return out;
}

// ETP reduce-scatter of partial H-wide rows (ETP-rank-major, each rank's rows as gathered): each rank gets its own
// rows summed over the ETP ranks in rank order, so every rank adds the same partials in the same order.
std::vector<float> etp_reduce_scatter(const comm::Comm& etp, const std::vector<float>& partial,
                                      const std::vector<int64_t>& rows, int H) {
  const int Q = etp.size;
  const size_t mine = size_t(rows[etp.rank]) * H;
  std::vector<size_t> sc(Q), sd(Q), rc(Q, mine), rd(Q);
  size_t at = 0;
  for (int q = 0; q < Q; ++q) {
    sc[q] = size_t(rows[q]) * H;
    sd[q] = at;
    at += sc[q];
    rd[q] = size_t(q) * mine;
  }
  std::vector<float> got(size_t(Q) * mine), out(mine, 0.0f);
  comm::all_to_all_v(etp, partial.data(), sc.data(), sd.data(), got.data(), rc.data(), rd.data(), comm::DType::F32);
  for (int q = 0; q < Q; ++q)
    for (size_t i = 0; i < mine; ++i) out[i] += got[size_t(q) * mine + i];
  return out;
}

}  // namespace

void check_moe_args(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s) {
  check_moe_args(ep, comm::Comm{}, c, w, tokens, s);
}

void check_moe_args(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s) {
  // Local checks first, then one collective verdict: a rank with bad input must not leave the others waiting.
  std::string err = moe_config_error(c, ep.size);
  if (err.empty() && (c.expert_ffn % etp.size != 0 || local_ffn(c, w) * etp.size != c.expert_ffn))
    err = "the weights hold " + std::to_string(local_ffn(c, w)) + " FFN columns per expert but expert_ffn / ETP = " +
          std::to_string(c.expert_ffn) + " / " + std::to_string(etp.size) + "; choose an ETP size that divides expert_ffn";
  if (err.empty() && w.local_experts * ep.size != c.experts)
    err = "the weights hold " + std::to_string(w.local_experts) + " experts per rank but experts / EP = " +
          std::to_string(c.experts) + " / " + std::to_string(ep.size);
  if (err.empty() && s.chunks > tokens)
    err = "ep_chunks = " + std::to_string(s.chunks) + " is more than the " + std::to_string(tokens) +
          " local tokens on EP rank " + std::to_string(ep.rank) + "; use at most " +
          std::to_string(std::max(1, tokens)) + " chunks";
  comm::raise_if_any(ep, err);
  comm::require_same(ep, c.hidden, "hidden");
  comm::require_same(ep, (static_cast<long long>(c.experts) << 20) | c.top_k, "experts/top_k");
  comm::require_same(ep, (static_cast<long long>(c.expert_ffn) << 24) | c.shared_ffn, "expert_ffn/shared_ffn");
  comm::require_same(ep, s.chunks, "ep_chunks");
  if (etp.size > 1) {
    comm::raise_if_any(etp, err);
    comm::require_same(etp, (static_cast<long long>(c.experts) << 20) | c.top_k, "experts/top_k");
    comm::require_same(etp, (static_cast<long long>(c.expert_ffn) << 24) | s.chunks, "expert_ffn/ep_chunks");
  }
}

void restore_routing(const MoeConfig& c, const MoeWeights& w, int ep_size, int etp_size, const ChunkSchedule& s,
                     MoeSaved& sv) {
  const int H = c.hidden, E = c.experts, K = c.top_k, P = ep_size, L = w.local_experts, N = s.chunks;
  const std::vector<int> bounds = chunk_bounds(sv.tokens, N, s.weights);
  sv.counts_send.assign(size_t(P) * N * L, 0);
  for (int ch = 0; ch < N; ++ch)
    for (int t = bounds[ch]; t < bounds[ch + 1]; ++t)
      for (int k = 0; k < K; ++k) {
        const int e = sv.idx[size_t(t) * K + k];
        ++sv.counts_send[(size_t(e / L) * N + ch) * L + e % L];
      }
  sv.chunks.resize(N);
  for (int ch = 0; ch < N; ++ch) {
    ChunkBuffers& b = sv.chunks[ch];
    b.t0 = bounds[ch];
    b.t1 = bounds[ch + 1];
    send_layout(b, sv.idx.data(), K, E, P, L, H);
    recv_layout(b, sv.counts_recv, P, N, L, H, ch);
    etp_layout(b, sv, etp_size, P, N, L, ch);
  }
}

void moe_forward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                 const float* x, int tokens, float* out, MoeSaved& sv, const ExecOptions& o,
                 std::vector<StepTime>* times) {
  moe_forward(ep, comm::Comm{}, c, w, s, x, tokens, out, sv, o, times);
}

void moe_forward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                 const ChunkSchedule& s, const float* x, int tokens, float* out, MoeSaved& sv, const ExecOptions& o,
                 std::vector<StepTime>* times) {
  check_moe_args(ep, etp, c, w, tokens, s);
  comm::raise_if_any(ep, poll_error(o));
  const int H = c.hidden, E = c.experts, K = c.top_k, F = local_ffn(c, w), S = c.shared_ffn;
  const int P = ep.size, L = w.local_experts, N = s.chunks, T = tokens, Q = etp.size;
  const RouterParams rp = router_params(c);
  const std::vector<int> bounds = chunk_bounds(T, N, s.weights);
  sv = MoeSaved{};
  sv.tokens = T;
  sv.x = x;
  sv.chunks.resize(N);
  for (int ch = 0; ch < N; ++ch) {
    sv.chunks[ch].t0 = bounds[ch];
    sv.chunks[ch].t1 = bounds[ch + 1];
  }
  std::vector<size_t> cnt_counts(P, size_t(N) * L), cnt_displs(P);
  for (int r = 0; r < P; ++r) cnt_displs[r] = size_t(r) * N * L;

  Runner run{s.forward, o, times, {}, {}};
  run.start_comm = [&](const Step& st) -> comm::Request {
    if (st.op == StepOp::Counts)
      return comm::iall_to_all_v(ep, sv.counts_send.data(), cnt_counts.data(), cnt_displs.data(),
                                 sv.counts_recv.data(), cnt_counts.data(), cnt_displs.data(), comm::DType::I64);
    ChunkBuffers& b = sv.chunks[st.chunk];
    if (st.op == StepOp::Dispatch) {
      // Counts are known: size the receive side of this chunk.
      const size_t rows = recv_layout(b, sv.counts_recv, P, N, L, H, st.chunk);
      b.xr.resize(rows * H);
      return comm::iall_to_all_v(ep, b.xp.data(), b.send_counts.data(), b.send_displs.data(), b.xr.data(),
                                 b.recv_counts.data(), b.recv_displs.data(), comm::DType::F32);
    }
    // Combine: the reverse route of the dispatch.
    b.yp.resize(b.xp.size());
    return comm::iall_to_all_v(ep, b.ye_src.data(), b.recv_counts.data(), b.recv_displs.data(), b.yp.data(),
                               b.send_counts.data(), b.send_displs.data(), comm::DType::F32);
  };
  run.run_compute = [&](const Step& st, const Poll& poll) {
    switch (st.op) {
      case StepOp::Route: {
        std::vector<float> logits(size_t(T) * E);
        gemm_rows(x, w.router.data(), logits.data(), T, H, E, nullptr, std::max(1, T));
        sv.scores.resize(size_t(T) * E);
        sv.idx.resize(size_t(T) * K);
        sv.w.resize(size_t(T) * K);
        const float* bias = c.router == Router::SigmoidGroupLimited ? w.expert_bias.data() : nullptr;
        for (int t = 0; t < T; ++t)
          route_token(rp, &logits[size_t(t) * E], bias, &sv.scores[size_t(t) * E], &sv.idx[size_t(t) * K],
                      &sv.w[size_t(t) * K]);
        sv.counts_send.assign(size_t(P) * N * L, 0);
        sv.counts_recv.assign(size_t(P) * N * L, 0);
        for (int ch = 0; ch < N; ++ch)
          for (int t = bounds[ch]; t < bounds[ch + 1]; ++t)
            for (int k = 0; k < K; ++k) {
              const int e = sv.idx[size_t(t) * K + k];
              ++sv.counts_send[(size_t(e / L) * N + ch) * L + e % L];
            }
        break;
      }
      case StepOp::Permute: {
        ChunkBuffers& b = sv.chunks[st.chunk];
        const int n = (b.t1 - b.t0) * K;
        send_layout(b, sv.idx.data(), K, E, P, L, H);
        b.xp.resize(size_t(n) * H);
        for (int i = 0; i < n; ++i)
          std::memcpy(&b.xp[size_t(b.row_of_slot[i]) * H], x + size_t(b.t0 + i / K) * H, sizeof(float) * H);
        break;
      }
      case StepOp::SharedFwd: {
        sv.sh1.resize(size_t(T) * 2 * S);
        sv.sact.resize(size_t(T) * S);
        sv.sout.resize(size_t(T) * H);
        gemm_rows(x, w.shared_w1.data(), sv.sh1.data(), T, H, 2 * S, poll, o.poll_rows);
        swiglu_rows(sv.sh1.data(), sv.sact.data(), T, S);
        gemm_rows(sv.sact.data(), w.shared_w2.data(), sv.sout.data(), T, S, H, poll, o.poll_rows);
        if (c.shared_gate) {
          sv.sgate.resize(T);
          for (int t = 0; t < T; ++t) {
            float z = 0;
            for (int h = 0; h < H; ++h) z += x[size_t(t) * H + h] * w.shared_gate[h];
            sv.sgate[t] = sigmoid_(z);
          }
        }
        break;
      }
      case StepOp::ExpertFwd: {
        ChunkBuffers& b = sv.chunks[st.chunk];
        // ETP: every ETP rank's counts once per pass, then this chunk's received rows of every ETP rank; the GEMMs
        // run on (ETP rank, source) blocks as if there were Q * P sources.
        if (Q > 1 && sv.counts_recv_etp.empty()) {
          sv.counts_recv_etp.resize(size_t(Q) * sv.counts_recv.size());
          comm::all_gather(etp, sv.counts_recv.data(), sv.counts_recv_etp.data(), sv.counts_recv.size(),
                           comm::DType::I64);
        }
        etp_layout(b, sv, Q, P, N, L, st.chunk);
        const std::vector<int64_t> peer_rows = etp_rows(b.etp_by_block, Q, P, L);
        std::vector<float> gathered;
        if (Q > 1) gathered = etp_gather(etp, b.xr, peer_rows, H);
        const std::vector<float>& xin = Q > 1 ? gathered : b.xr;
        const int64_t rows = static_cast<int64_t>(xin.size() / H);
        const int PQ = P * Q;
        b.xe.resize(xin.size());
        reorder_rows(b.etp_by_block.data(), PQ, L, xin.data(), b.xe.data(), H, true);
        b.h1.resize(size_t(rows) * 2 * F);
        b.act.resize(size_t(rows) * F);
        std::vector<float> ye(size_t(rows) * H);
        const std::vector<int64_t> off = block_table(b.etp_by_block, PQ, L).expert_off;
        for (int e = 0; e < L; ++e) {
          const int64_t r0 = off[e], n = off[e + 1] - off[e];
          if (!n) continue;
          gemm_rows(&b.xe[r0 * H], &w.w1[size_t(e) * H * 2 * F], &b.h1[r0 * 2 * F], n, H, 2 * F, poll, o.poll_rows);
          swiglu_rows(&b.h1[r0 * 2 * F], &b.act[r0 * F], n, F);
          gemm_rows(&b.act[r0 * F], &w.w2[size_t(e) * F * H], &ye[r0 * H], n, F, H, poll, o.poll_rows);
        }
        if (Q > 1) {
          std::vector<float> by_rank(ye.size());
          reorder_rows(b.etp_by_block.data(), PQ, L, ye.data(), by_rank.data(), H, false);
          b.ye_src = etp_reduce_scatter(etp, by_rank, peer_rows, H);
        } else {
          b.ye_src.resize(ye.size());
          reorder_rows(b.recv_by_block.data(), P, L, ye.data(), b.ye_src.data(), H, false);
        }
        break;
      }
      case StepOp::Unpermute: {
        const ChunkBuffers& b = sv.chunks[st.chunk];
        for (int t = b.t0; t < b.t1; ++t) {
          float* o_t = out + size_t(t) * H;
          std::fill(o_t, o_t + H, 0.0f);
          for (int k = 0; k < K; ++k) {  // fixed k order: the sum does not depend on the chunking
            const float wk = sv.w[size_t(t) * K + k];
            const float* y = &b.yp[size_t(b.row_of_slot[(t - b.t0) * K + k]) * H];
            for (int h = 0; h < H; ++h) o_t[h] += wk * y[h];
          }
          if (S) {
            const float g = c.shared_gate ? sv.sgate[t] : 1.0f;
            for (int h = 0; h < H; ++h) o_t[h] += g * sv.sout[size_t(t) * H + h];
          }
        }
        break;
      }
      default:
        throw std::logic_error(std::string("forward schedule has a backward step: ") + op_name(st.op));
    }
  };
  run.run();
}

void moe_backward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                  MoeSaved& sv, const float* dout, float* dx, MoeWeights& g, const ExecOptions& o,
                  std::vector<StepTime>* times) {
  moe_backward(ep, comm::Comm{}, c, w, s, sv, dout, dx, g, o, times);
}

void moe_backward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                  const ChunkSchedule& s, MoeSaved& sv, const float* dout, float* dx, MoeWeights& g,
                  const ExecOptions& o, std::vector<StepTime>* times) {
  std::string err = poll_error(o);
  if (err.empty() && static_cast<int>(sv.chunks.size()) != s.chunks)
    err = "backward schedule has " + std::to_string(s.chunks) + " chunks but the forward ran with " +
          std::to_string(sv.chunks.size());
  comm::raise_if_any(ep, err);  // collective, so a rank with a mismatched schedule cannot strand the others
  const int H = c.hidden, E = c.experts, K = c.top_k, F = local_ffn(c, w), S = c.shared_ffn;
  const int P = ep.size, L = w.local_experts, T = sv.tokens, Q = etp.size, PQ = P * Q;
  const float* x = sv.x;
  const RouterParams rp = router_params(c);
  g = zeros_like(w);
  sv.dw.assign(size_t(T) * K, 0.0f);
  sv.dx_routed.assign(size_t(T) * H, 0.0f);
  sv.dx_shared.assign(size_t(T) * H, 0.0f);

  Runner run{s.backward, o, times, {}, {}};
  run.start_comm = [&](const Step& st) -> comm::Request {
    ChunkBuffers& b = sv.chunks[st.chunk];
    if (st.op == StepOp::CombineBwd) {  // output grads travel the dispatch route
      b.dyr.resize(recv_rows(b) * H);
      return comm::iall_to_all_v(ep, b.dyp.data(), b.send_counts.data(), b.send_displs.data(), b.dyr.data(),
                                 b.recv_counts.data(), b.recv_displs.data(), comm::DType::F32);
    }
    b.dxp.resize(b.row_of_slot.size() * H);  // DispatchBwd: input grads travel the combine route
    return comm::iall_to_all_v(ep, b.dx_src.data(), b.recv_counts.data(), b.recv_displs.data(), b.dxp.data(),
                               b.send_counts.data(), b.send_displs.data(), comm::DType::F32);
  };
  run.run_compute = [&](const Step& st, const Poll& poll) {
    switch (st.op) {
      case StepOp::UnpermuteBwd: {
        ChunkBuffers& b = sv.chunks[st.chunk];
        b.dyp.resize(b.yp.size());
        for (int t = b.t0; t < b.t1; ++t)
          for (int k = 0; k < K; ++k) {
            const size_t row = size_t(b.row_of_slot[(t - b.t0) * K + k]);
            const float wk = sv.w[size_t(t) * K + k];
            const float* d = dout + size_t(t) * H;
            const float* y = &b.yp[row * H];
            float dot = 0;
            for (int h = 0; h < H; ++h) {
              b.dyp[row * H + h] = wk * d[h];
              dot += d[h] * y[h];
            }
            sv.dw[size_t(t) * K + k] = dot;
          }
        break;
      }
      case StepOp::SharedBwd: {
        std::vector<float> dso(size_t(T) * H), dsact(size_t(T) * S), dsh1(size_t(T) * 2 * S);
        for (int t = 0; t < T; ++t) {
          const float gt = c.shared_gate ? sv.sgate[t] : 1.0f;
          float dz = 0;
          for (int h = 0; h < H; ++h) {
            const float d = dout[size_t(t) * H + h];
            dso[size_t(t) * H + h] = gt * d;
            dz += d * sv.sout[size_t(t) * H + h];
          }
          if (c.shared_gate) {
            dz *= gt * (1.0f - gt);  // through the sigmoid gate
            for (int h = 0; h < H; ++h) {
              g.shared_gate[h] += dz * x[size_t(t) * H + h];
              sv.dx_shared[size_t(t) * H + h] = dz * w.shared_gate[h];
            }
          }
        }
        gemm_at(sv.sact.data(), dso.data(), g.shared_w2.data(), T, S, H, poll, o.poll_rows);
        gemm_rows_bt(dso.data(), w.shared_w2.data(), dsact.data(), T, H, S, poll, o.poll_rows);
        swiglu_bwd_rows(sv.sh1.data(), dsact.data(), dsh1.data(), T, S);
        gemm_at(x, dsh1.data(), g.shared_w1.data(), T, H, 2 * S, poll, o.poll_rows);
        std::vector<float> dxs(size_t(T) * H);
        gemm_rows_bt(dsh1.data(), w.shared_w1.data(), dxs.data(), T, 2 * S, H, poll, o.poll_rows);
        for (size_t i = 0; i < dxs.size(); ++i) sv.dx_shared[i] += dxs[i];
        break;
      }
      case StepOp::ExpertDgrad: {
        ChunkBuffers& b = sv.chunks[st.chunk];
        // ETP: the output gradient of every ETP rank's received rows (each rank's columns need all of them).
        const std::vector<int64_t> peer_rows = etp_rows(b.etp_by_block, Q, P, L);
        std::vector<float> gathered;
        if (Q > 1) gathered = etp_gather(etp, b.dyr, peer_rows, H);
        const std::vector<float>& din = Q > 1 ? gathered : b.dyr;
        const int64_t rows = static_cast<int64_t>(din.size() / H);
        b.dye.resize(din.size());
        reorder_rows(b.etp_by_block.data(), PQ, L, din.data(), b.dye.data(), H, true);
        b.dh1.resize(size_t(rows) * 2 * F);
        std::vector<float> dact(size_t(rows) * F), dxe(size_t(rows) * H);
        const std::vector<int64_t> off = block_table(b.etp_by_block, PQ, L).expert_off;
        for (int e = 0; e < L; ++e) {
          const int64_t r0 = off[e], n = off[e + 1] - off[e];
          if (!n) continue;
          gemm_rows_bt(&b.dye[r0 * H], &w.w2[size_t(e) * F * H], &dact[r0 * F], n, H, F, poll, o.poll_rows);
          swiglu_bwd_rows(&b.h1[r0 * 2 * F], &dact[r0 * F], &b.dh1[r0 * 2 * F], n, F);
          gemm_rows_bt(&b.dh1[r0 * 2 * F], &w.w1[size_t(e) * H * 2 * F], &dxe[r0 * H], n, 2 * F, H, poll,
                       o.poll_rows);
        }
        if (Q > 1) {
          std::vector<float> by_rank(dxe.size());
          reorder_rows(b.etp_by_block.data(), PQ, L, dxe.data(), by_rank.data(), H, false);
          b.dx_src = etp_reduce_scatter(etp, by_rank, peer_rows, H);
        } else {
          b.dx_src.resize(dxe.size());
          reorder_rows(b.recv_by_block.data(), P, L, dxe.data(), b.dx_src.data(), H, false);
        }
        break;
      }
      case StepOp::ExpertWgrad: {
        // Delayed: every chunk's weight gradient, after the last dgrad, while the tail dispatch-bwd flies. Rows of
        // expert e are summed source by source, chunk by chunk: the unchunked buffer's order (each source's rows
        // are in token order and chunks are consecutive token ranges), so the sums are bit-identical to no-chunk.
        for (int e = 0; e < L; ++e) {
          float* gw1 = &g.w1[size_t(e) * H * 2 * F];
          float* gw2 = &g.w2[size_t(e) * F * H];
          for (int q = 0; q < PQ; ++q)  // (ETP rank, source) blocks in order
            for (const ChunkBuffers& b : sv.chunks) {
              const int64_t n = b.etp_by_block[size_t(q) * L + e];
              if (!n) continue;
              const int64_t r0 = block_offset_expert_major(b.etp_by_block.data(), PQ, L, q, e);
              gemm_at(b.act.data() + r0 * F, b.dye.data() + r0 * H, gw2, n, F, H, poll, o.poll_rows);
              gemm_at(b.xe.data() + r0 * H, b.dh1.data() + r0 * 2 * F, gw1, n, H, 2 * F, poll, o.poll_rows);
            }
        }
        break;
      }
      case StepOp::PermuteBwd: {
        const ChunkBuffers& b = sv.chunks[st.chunk];
        for (int t = b.t0; t < b.t1; ++t) {
          float* d = &sv.dx_routed[size_t(t) * H];
          for (int k = 0; k < K; ++k) {
            const float* src = &b.dxp[size_t(b.row_of_slot[(t - b.t0) * K + k]) * H];
            for (int h = 0; h < H; ++h) d[h] += src[h];
          }
        }
        break;
      }
      case StepOp::RouterBwd: {
        std::vector<float> dlogits(size_t(T) * E);
        for (int t = 0; t < T; ++t)
          route_token_bwd(rp, &sv.scores[size_t(t) * E], &sv.idx[size_t(t) * K], &sv.dw[size_t(t) * K],
                          &dlogits[size_t(t) * E]);
        gemm_at(x, dlogits.data(), g.router.data(), T, H, E);
        std::vector<float> dxr(size_t(T) * H);
        gemm_rows_bt(dlogits.data(), w.router.data(), dxr.data(), T, E, H, nullptr, std::max(1, T));
        for (size_t i = 0; i < dxr.size(); ++i) dx[i] = (sv.dx_routed[i] + sv.dx_shared[i]) + dxr[i];
        break;
      }
      default:
        throw std::logic_error(std::string("backward schedule has a forward step: ") + op_name(st.op));
    }
  };
  run.run();
}

}  // namespace lcplan::moe
