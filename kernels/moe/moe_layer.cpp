#include "kernels/moe/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/moe/cpu_gemm.h"

namespace lcplan::moe {

namespace {

// Counter-based generator: a weight's value depends only on (seed, tensor, index), never on call order.
float hash_uniform(uint64_t seed, uint64_t tensor, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + tensor * 0xD1B54A32D192ED03ull + i * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;  // [-1, 1)
}

void fill(std::vector<float>& v, size_t n, uint64_t seed, uint64_t tensor, uint64_t first, float scale) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * hash_uniform(seed, tensor, first + i);
}

using Poll = std::function<void()>;

// C[rows x n] = A[rows x k] * B[k x n], in row blocks with a progress poll between them. cpu_gemm's fixed
// summation order makes each row's result independent of the blocking and of the chunk it belongs to.
void gemm_rows(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block) {
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    cpu::gemm_nn(A + r0 * k, B, C + r0 * n, std::min<int64_t>(block, rows - r0), k, n);
    if (poll) poll();
  }
}

// C[rows x n] = A[rows x k] * B[n x k]^T (dgrad through a weight stored k-major): B is transposed once.
void gemm_rows_bt(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block) {
  if (rows == 0) return;
  std::vector<float> bt;
  cpu::transpose(B, n, k, bt);
  gemm_rows(A, bt.data(), C, rows, k, n, poll, block);
}

// G[k x n] += A[rows x k]^T * D[rows x n] (weight gradient), rows summed in ascending order; polls every block rows.
void gemm_at(const float* A, const float* D, float* G, int64_t rows, int k, int n, const Poll& poll = {},
             int block = 1 << 30) {
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    cpu::gemm_tn_acc(A + r0 * k, D + r0 * n, G, std::min<int64_t>(block, rows - r0), k, n);
    if (poll) poll();
  }
}

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

// Rows of each local expert in the expert-major buffer: offsets[e]..offsets[e+1].
std::vector<int64_t> expert_offsets(const std::vector<int64_t>& by_block, int P, int L) {
  std::vector<int64_t> off(L + 1, 0);
  for (int e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int s = 0; s < P; ++s) n += by_block[s * L + e];
    off[e + 1] = off[e] + n;
  }
  return off;
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

// A row block below one would never advance through the GEMM rows.
std::string poll_error(const ExecOptions& o) {
  return o.poll_rows >= 1 ? "" : "ExecOptions::poll_rows = " + std::to_string(o.poll_rows) + " must be at least 1";
}

}  // namespace

RouterParams router_params(const MoeConfig& c) {
  RouterParams p;
  p.kind = c.router;
  p.experts = c.experts;
  p.top_k = c.top_k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.normalize = c.normalize;
  p.scale = c.scale;
  return p;
}

namespace {
std::string config_error(const MoeConfig& c, int ep_size) {
  auto s = [](long v) { return std::to_string(v); };
  if (c.hidden < 1 || c.experts < 1 || c.top_k < 1 || c.expert_ffn < 1)
    return "MoE config needs positive hidden, experts, top_k and expert_ffn (got " + s(c.hidden) + ", " +
           s(c.experts) + ", " + s(c.top_k) + ", " + s(c.expert_ffn) + ")";
  if (c.experts % ep_size != 0)
    return "experts = " + s(c.experts) + " is not divisible by EP = " + s(ep_size) +
           "; choose an EP size that divides the expert count";
  if (c.top_k > c.experts) return "top_k = " + s(c.top_k) + " exceeds experts = " + s(c.experts);
  if (c.router == Router::SigmoidGroupLimited) {
    if (c.n_group < 1 || c.n_group > kMaxGroups || c.experts % c.n_group != 0)
      return "n_group = " + s(c.n_group) + " must divide experts = " + s(c.experts) + " and be at most 64";
    if (c.topk_group < 1 || c.topk_group > c.n_group)
      return "topk_group = " + s(c.topk_group) + " must be between 1 and n_group = " + s(c.n_group);
    if (c.top_k > c.topk_group * (c.experts / c.n_group))
      return "top_k = " + s(c.top_k) + " exceeds the " + s(c.topk_group * (c.experts / c.n_group)) +
             " experts in the kept groups";
  }
  return "";
}
}  // namespace

MoeWeights make_weights(const MoeConfig& c, int ep_rank, int ep_size, uint64_t seed) {
  const std::string err = config_error(c, ep_size);
  if (!err.empty()) throw std::invalid_argument(err);
  const size_t H = c.hidden, E = c.experts, F = c.expert_ffn, S = c.shared_ffn;
  MoeWeights w;
  w.local_experts = c.experts / ep_size;
  w.first_expert = ep_rank * w.local_experts;
  const float sh = 1.0f / std::sqrt(float(H)), sf = 1.0f / std::sqrt(float(F));
  fill(w.router, H * E, seed, 1, 0, sh);
  fill(w.expert_bias, E, seed, 2, 0, c.router == Router::SigmoidGroupLimited ? 0.1f : 0.0f);
  const size_t n1 = H * 2 * F, n2 = F * H;
  fill(w.w1, w.local_experts * n1, seed, 3, w.first_expert * n1, sh);
  fill(w.w2, w.local_experts * n2, seed, 4, w.first_expert * n2, sf);
  if (S) {
    fill(w.shared_w1, H * 2 * S, seed, 5, 0, sh);
    fill(w.shared_w2, S * H, seed, 6, 0, 1.0f / std::sqrt(float(S)));
    if (c.shared_gate) fill(w.shared_gate, H, seed, 7, 0, sh);
  }
  return w;
}

MoeWeights zeros_like(const MoeWeights& w) {
  MoeWeights z = w;
  for (auto* v : {&z.router, &z.expert_bias, &z.w1, &z.w2, &z.shared_w1, &z.shared_w2, &z.shared_gate})
    std::fill(v->begin(), v->end(), 0.0f);
  return z;
}

void check_moe_args(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s) {
  // Local checks first, then one collective verdict: a rank with bad input must not leave the others waiting.
  std::string err = config_error(c, ep.size);
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
}

void moe_forward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                 const float* x, int tokens, float* out, MoeSaved& sv, const ExecOptions& o,
                 std::vector<StepTime>* times) {
  check_moe_args(ep, c, w, tokens, s);
  comm::raise_if_any(ep, poll_error(o));
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const int P = ep.size, L = w.local_experts, N = s.chunks, T = tokens;
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
      b.recv_by_block.assign(size_t(P) * L, 0);
      b.recv_counts.assign(P, 0);
      b.recv_displs.assign(P, 0);
      size_t rows = 0;
      for (int q = 0; q < P; ++q) {
        b.recv_displs[q] = rows * H;
        for (int e = 0; e < L; ++e) {
          const int64_t n = sv.counts_recv[(size_t(q) * N + st.chunk) * L + e];
          b.recv_by_block[size_t(q) * L + e] = n;
          rows += n;
          b.recv_counts[q] += n * H;
        }
      }
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
        std::vector<int> offsets(E + 1);
        b.row_of_slot.resize(n);
        expert_major_rows(&sv.idx[size_t(b.t0) * K], n, E, offsets.data(), b.row_of_slot.data());
        b.send_by_expert.resize(E);
        for (int e = 0; e < E; ++e) b.send_by_expert[e] = offsets[e + 1] - offsets[e];
        b.send_counts.assign(P, 0);
        b.send_displs.assign(P, 0);
        for (int q = 0; q < P; ++q) {  // experts are contiguous per rank, so expert-major is also rank-major
          b.send_displs[q] = size_t(offsets[q * L]) * H;
          b.send_counts[q] = size_t(offsets[(q + 1) * L] - offsets[q * L]) * H;
        }
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
        const int64_t rows = static_cast<int64_t>(b.xr.size() / H);
        b.xe.resize(b.xr.size());
        reorder_rows(b.recv_by_block.data(), P, L, b.xr.data(), b.xe.data(), H, true);
        b.h1.resize(size_t(rows) * 2 * F);
        b.act.resize(size_t(rows) * F);
        std::vector<float> ye(size_t(rows) * H);
        const auto off = expert_offsets(b.recv_by_block, P, L);
        for (int e = 0; e < L; ++e) {
          const int64_t r0 = off[e], n = off[e + 1] - off[e];
          if (!n) continue;
          gemm_rows(&b.xe[r0 * H], &w.w1[size_t(e) * H * 2 * F], &b.h1[r0 * 2 * F], n, H, 2 * F, poll, o.poll_rows);
          swiglu_rows(&b.h1[r0 * 2 * F], &b.act[r0 * F], n, F);
          gemm_rows(&b.act[r0 * F], &w.w2[size_t(e) * F * H], &ye[r0 * H], n, F, H, poll, o.poll_rows);
        }
        b.ye_src.resize(ye.size());
        reorder_rows(b.recv_by_block.data(), P, L, ye.data(), b.ye_src.data(), H, false);
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
  std::string err = poll_error(o);
  if (err.empty() && static_cast<int>(sv.chunks.size()) != s.chunks)
    err = "backward schedule has " + std::to_string(s.chunks) + " chunks but the forward ran with " +
          std::to_string(sv.chunks.size());
  comm::raise_if_any(ep, err);  // collective, so a rank with a mismatched schedule cannot strand the others
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const int P = ep.size, L = w.local_experts, T = sv.tokens;
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
      b.dyr.resize(b.xr.size());
      return comm::iall_to_all_v(ep, b.dyp.data(), b.send_counts.data(), b.send_displs.data(), b.dyr.data(),
                                 b.recv_counts.data(), b.recv_displs.data(), comm::DType::F32);
    }
    b.dxp.resize(b.xp.size());  // DispatchBwd: input grads travel the combine route
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
        const int64_t rows = static_cast<int64_t>(b.xr.size() / H);
        b.dye.resize(b.dyr.size());
        reorder_rows(b.recv_by_block.data(), P, L, b.dyr.data(), b.dye.data(), H, true);
        b.dh1.resize(size_t(rows) * 2 * F);
        std::vector<float> dact(size_t(rows) * F), dxe(size_t(rows) * H);
        const auto off = expert_offsets(b.recv_by_block, P, L);
        for (int e = 0; e < L; ++e) {
          const int64_t r0 = off[e], n = off[e + 1] - off[e];
          if (!n) continue;
          gemm_rows_bt(&b.dye[r0 * H], &w.w2[size_t(e) * F * H], &dact[r0 * F], n, H, F, poll, o.poll_rows);
          swiglu_bwd_rows(&b.h1[r0 * 2 * F], &dact[r0 * F], &b.dh1[r0 * 2 * F], n, F);
          gemm_rows_bt(&b.dh1[r0 * 2 * F], &w.w1[size_t(e) * H * 2 * F], &dxe[r0 * H], n, 2 * F, H, poll,
                       o.poll_rows);
        }
        b.dx_src.resize(dxe.size());
        reorder_rows(b.recv_by_block.data(), P, L, dxe.data(), b.dx_src.data(), H, false);
        break;
      }
      case StepOp::ExpertWgrad: {
        // Delayed: every chunk's weight gradient, after the last dgrad, while the tail dispatch-bwd flies. Rows of
        // expert e are summed source by source, chunk by chunk: the unchunked buffer's order (each source's rows
        // are in token order and chunks are consecutive token ranges), so the sums are bit-identical to no-chunk.
        for (int e = 0; e < L; ++e) {
          float* gw1 = &g.w1[size_t(e) * H * 2 * F];
          float* gw2 = &g.w2[size_t(e) * F * H];
          for (int q = 0; q < P; ++q)
            for (const ChunkBuffers& b : sv.chunks) {
              const int64_t n = b.recv_by_block[size_t(q) * L + e];
              if (!n) continue;
              const int64_t r0 = block_offset_expert_major(b.recv_by_block.data(), P, L, q, e);
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

// Reference y = swiglu(x W1) W2 for one row of H values in T precision; keeps h1 (2f) and a (f) for a backward.
template <class T>
void reference_ffn_row(const T* xr, const float* W1, const float* W2, int H, int f, std::vector<T>& h1,
                       std::vector<T>& a, T* yr) {
  h1.assign(2 * f, T(0));
  a.assign(f, T(0));
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < 2 * f; ++j) h1[j] += xr[h] * T(W1[size_t(h) * 2 * f + j]);
  for (int j = 0; j < f; ++j) a[j] = swiglu(h1[j], h1[f + j]);
  for (int h = 0; h < H; ++h) yr[h] = 0;
  for (int j = 0; j < f; ++j)
    for (int h = 0; h < H; ++h) yr[h] += a[j] * T(W2[size_t(j) * H + h]);
}

template <class T>
void moe_reference_forward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens, T* out) {
  if (w.local_experts != c.experts) throw std::invalid_argument("the reference needs every expert on one rank");
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const RouterParams rp = router_params(c);
  std::vector<T> logits(E), scores(E), wk(K), bias(w.expert_bias.begin(), w.expert_bias.end()), h1, a, y(H);
  std::vector<int> idx(K);
  auto ffn = [&](const T* xr, const float* W1, const float* W2, int f, T* yr) {
    reference_ffn_row(xr, W1, W2, H, f, h1, a, yr);
  };
  for (int t = 0; t < tokens; ++t) {
    const T* xt = x + size_t(t) * H;
    T* ot = out + size_t(t) * H;
    for (int e = 0; e < E; ++e) {
      logits[e] = 0;
      for (int h = 0; h < H; ++h) logits[e] += xt[h] * T(w.router[size_t(h) * E + e]);
    }
    route_token(rp, logits.data(), c.router == Router::SigmoidGroupLimited ? bias.data() : nullptr, scores.data(),
                idx.data(), wk.data());
    for (int h = 0; h < H; ++h) ot[h] = 0;
    for (int k = 0; k < K; ++k) {
      ffn(xt, &w.w1[size_t(idx[k]) * H * 2 * F], &w.w2[size_t(idx[k]) * F * H], F, y.data());
      for (int h = 0; h < H; ++h) ot[h] += wk[k] * y[h];
    }
    if (S) {
      ffn(xt, w.shared_w1.data(), w.shared_w2.data(), S, y.data());
      T gt = 1;
      if (c.shared_gate) {
        T z = 0;
        for (int h = 0; h < H; ++h) z += xt[h] * T(w.shared_gate[h]);
        gt = sigmoid_(z);
      }
      for (int h = 0; h < H; ++h) ot[h] += gt * y[h];
    }
  }
}

template void moe_reference_forward<float>(const MoeConfig&, const MoeWeights&, const float*, int, float*);
template void moe_reference_forward<double>(const MoeConfig&, const MoeWeights&, const double*, int, double*);

template <class T>
ReferenceGrads<T> moe_reference_backward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens,
                                         const T* dout) {
  if (w.local_experts != c.experts) throw std::invalid_argument("the reference needs every expert on one rank");
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const RouterParams rp = router_params(c);
  ReferenceGrads<T> g;
  g.dx.assign(size_t(tokens) * H, T(0));
  g.router.assign(w.router.size(), T(0));
  g.w1.assign(w.w1.size(), T(0));
  g.w2.assign(w.w2.size(), T(0));
  g.shared_w1.assign(w.shared_w1.size(), T(0));
  g.shared_w2.assign(w.shared_w2.size(), T(0));
  g.shared_gate.assign(w.shared_gate.size(), T(0));
  std::vector<T> logits(E), scores(E), wk(K), dwk(K), dlogits(E), bias(w.expert_bias.begin(), w.expert_bias.end());
  std::vector<T> h1, a, y(H), dy(H), da, dh1;
  std::vector<int> idx(K);
  auto ffn = [&](const T* xr, const float* W1, const float* W2, int f, T* yr) {
    reference_ffn_row(xr, W1, W2, H, f, h1, a, yr);
  };
  // Backward of the row just run through ffn: weight grads into gW1 / gW2, input grad added to dxr.
  auto ffn_bwd = [&](const T* xr, const float* W1, const float* W2, int f, const T* dyr, T* gW1, T* gW2, T* dxr) {
    da.assign(f, T(0));
    dh1.assign(2 * f, T(0));
    for (int j = 0; j < f; ++j)
      for (int h = 0; h < H; ++h) {
        gW2[size_t(j) * H + h] += a[j] * dyr[h];
        da[j] += dyr[h] * T(W2[size_t(j) * H + h]);
      }
    for (int j = 0; j < f; ++j) swiglu_bwd(h1[j], h1[f + j], da[j], &dh1[j], &dh1[f + j]);
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < 2 * f; ++j) {
        gW1[size_t(h) * 2 * f + j] += xr[h] * dh1[j];
        dxr[h] += dh1[j] * T(W1[size_t(h) * 2 * f + j]);
      }
  };
  for (int t = 0; t < tokens; ++t) {
    const T* xt = x + size_t(t) * H;
    const T* dt = dout + size_t(t) * H;
    T* dxt = g.dx.data() + size_t(t) * H;
    for (int e = 0; e < E; ++e) {
      logits[e] = 0;
      for (int h = 0; h < H; ++h) logits[e] += xt[h] * T(w.router[size_t(h) * E + e]);
    }
    route_token(rp, logits.data(), c.router == Router::SigmoidGroupLimited ? bias.data() : nullptr, scores.data(),
                idx.data(), wk.data());
    for (int k = 0; k < K; ++k) {  // out += w_k y_k: dw_k = <dout, y_k>, dy_k = w_k dout
      const size_t e = size_t(idx[k]);
      ffn(xt, &w.w1[e * H * 2 * F], &w.w2[e * F * H], F, y.data());
      dwk[k] = 0;
      for (int h = 0; h < H; ++h) {
        dwk[k] += dt[h] * y[h];
        dy[h] = wk[k] * dt[h];
      }
      ffn_bwd(xt, &w.w1[e * H * 2 * F], &w.w2[e * F * H], F, dy.data(), &g.w1[e * H * 2 * F], &g.w2[e * F * H], dxt);
    }
    if (S) {  // out += gate * ys
      ffn(xt, w.shared_w1.data(), w.shared_w2.data(), S, y.data());
      T gt = 1;
      if (c.shared_gate) {
        T z = 0;
        for (int h = 0; h < H; ++h) z += xt[h] * T(w.shared_gate[h]);
        gt = sigmoid_(z);
        T dz = 0;
        for (int h = 0; h < H; ++h) dz += dt[h] * y[h];
        dz *= gt * (T(1) - gt);
        for (int h = 0; h < H; ++h) {
          g.shared_gate[h] += dz * xt[h];
          dxt[h] += dz * T(w.shared_gate[h]);
        }
      }
      for (int h = 0; h < H; ++h) dy[h] = gt * dt[h];
      ffn_bwd(xt, w.shared_w1.data(), w.shared_w2.data(), S, dy.data(), g.shared_w1.data(), g.shared_w2.data(), dxt);
    }
    route_token_bwd(rp, scores.data(), idx.data(), dwk.data(), dlogits.data());
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < E; ++e) {
        g.router[size_t(h) * E + e] += xt[h] * dlogits[e];
        dxt[h] += dlogits[e] * T(w.router[size_t(h) * E + e]);
      }
  }
  return g;
}

template ReferenceGrads<double> moe_reference_backward<double>(const MoeConfig&, const MoeWeights&, const double*,
                                                               int, const double*);

}  // namespace lcplan::moe
