#include "executor/layers.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <Eigen/Core>

#include "executor/layer_ops_host.h"
#include "executor/layers/decoder_layer.h"
#include "executor/layers/embedding.h"
#include "executor/layers/loss.h"
#include "executor/ops.h"
#include "executor/ops_math.h"
#include "kernels/attention/attention.h"
#include "kernels/linear_ce/linear_ce.h"
#include "kernels/linear_ce/linear_ce_vocab_parallel.h"
#include "kernels/moe/cpu_gemm.h"
#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_math.h"

namespace lcplan::exec {

int64_t Ctx::chunk_start(int ch) const { return cp == 1 ? 0 : impl::cp_chunk_pos(*this, cp_rank, ch); }

namespace {

using WS = Buf<float>;

// The host ops (layer_ops_host.h) for the host-only code below, which holds a Ctx rather than an Ops object.
WS ws(Ctx& c, size_t n) { return HostOps{c.tr}.ws(n); }
Buf<bf16> save16(Ctx& c, const float* x, size_t n) { return HostOps{c.tr}.save16(x, n); }
Buf<float> save32(Ctx& c, const float* x, size_t n) { return HostOps{c.tr}.save32(x, n); }

using impl::gd;
using impl::wd;

// ---------------------------------------------------------------- tensor and sequence parallelism (Megatron)

using Rows = impl::Rows<HostOps>;

Rows sp_gather(Ctx& c, const float* mine, int64_t w) {
  HostOps o{c.tr};
  return impl::sp_gather(o, c, mine, w);
}

// Sequence-parallel reduce-scatter (Megatron reduce_scatter_to_sequence_parallel_region): partial sums [tokens x w]
// summed over TP, this rank's rows into out [rows x w].
void sp_reduce_scatter(Ctx& c, const float* partial, float* out, int64_t w) {
  comm::reduce_scatter(c.pg.tp, partial, out, size_t(c.rows * w), comm::DType::F32, comm::ReduceOp::Sum);
}

// The same for fp64 partial sums of the executor's GEMMs (ops.h): reduced in fp64, rounded once to fp32.
void sp_reduce_scatter64(Ctx& c, const double* partial, float* out, int64_t w) {
  Buf<double> mine(c.tr, Category::Workspace, size_t(c.rows * w));
  comm::reduce_scatter(c.pg.tp, partial, mine.data(), mine.size(), comm::DType::F64, comm::ReduceOp::Sum);
  for (size_t i = 0; i < mine.size(); ++i) out[i] = float(mine[i]);
}

// Row-parallel GEMM (Megatron RowParallelLinear with sequence parallelism): y [rows x n] = the TP sum of x [tokens x
// k] (this rank's k columns) times W [k x n] (this rank's k rows).
void row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n) {
  if (c.tp == 1) return matmul(c.tr, x, W, y, c.tokens, k, n);
  Buf<double> partial(c.tr, Category::Workspace, size_t(c.tokens * n));
  matmul64(c.tr, x, W, partial.data(), c.tokens, k, n);
  sp_reduce_scatter64(c, partial.data(), y, n);
}

// Column-parallel GEMM backward (Megatron ColumnParallelLinear with sequence parallelism): x_all [tokens x k] is the
// all-gathered input, dy [tokens x n] this rank's columns; dW += x_all^T dy, and the input gradient dy W^T, a partial
// sum over TP, reduce-scattered into dx [rows x k].
void col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                      int64_t n) {
  if (c.tp == 1) return matmul_bwd(c.tr, x_all, W, dy, dx, dW, c.tokens, k, n);
  Buf<double> partial(c.tr, Category::Workspace, size_t(c.tokens * k));
  matmul_bwd64(c.tr, x_all, W, dy, partial.data(), dW, c.tokens, k, n);
  sp_reduce_scatter64(c, partial.data(), dx, k);
}

// ---------------------------------------------------------------- MoE (kernels/moe CPU layer)

struct MoeW {
  moe::MoeWeights w;
  Tracker::Charge charge;
};

double vec_bytes(const std::vector<float>& v) { return double(v.size()) * sizeof(float); }

// The layer's weights as the kernel takes them (fp32), widened from the bf16 unit into workspace.
MoeW moe_weights(Ctx& c, const UnitLayout& u, const UnitView& w) {
  const moe::MoeConfig& cfg = c.d.moe;
  const size_t H = cfg.hidden, E = cfg.experts, F = cfg.expert_ffn / c.d.etp, S = cfg.shared_ffn;
  const int L = cfg.experts / c.pg.ep.size;
  MoeW r;
  r.w.first_expert = c.pg.ep.rank * L;
  r.w.local_experts = L;
  r.w.ffn_first = int(F) * c.d.etp_rank;  // this ETP rank's columns of every local expert (exec_model.cpp)
  r.w.ffn_local = int(F);
  auto get = [](const bf16* p, size_t n) {
    std::vector<float> v(n);
    to_f32(p, v.data(), n);
    return v;
  };
  r.w.router = get(w.dense + u.off.router, H * E);
  r.w.expert_bias = cfg.router == moe::Router::SigmoidGroupLimited ? get(w.dense + u.off.expert_bias, E)
                                                                    : std::vector<float>(E, 0.0f);
  r.w.w1 = get(w.expert + u.off.w1, size_t(L) * H * 2 * F);
  r.w.w2 = get(w.expert + u.off.w2, size_t(L) * F * H);
  if (S) {
    r.w.shared_w1 = get(w.dense + u.off.shared_w1, H * 2 * S);
    r.w.shared_w2 = get(w.dense + u.off.shared_w2, S * H);
  }
  if (cfg.shared_gate) r.w.shared_gate = get(w.dense + u.off.shared_gate, H);
  double bytes = 0;
  for (const auto* v : {&r.w.router, &r.w.expert_bias, &r.w.w1, &r.w.w2, &r.w.shared_w1, &r.w.shared_w2,
                        &r.w.shared_gate})
    bytes += vec_bytes(*v);
  r.charge = Tracker::Charge(c.tr, Category::Workspace, bytes);
  return r;
}

// Bytes the kernel's saved state holds (its fp32 buffers are the executor's MoE buffers, README "Memory mapping").
double moe_state_bytes(const moe::MoeSaved& s) {
  double b = vec_bytes(s.scores) + vec_bytes(s.w) + vec_bytes(s.sh1) + vec_bytes(s.sact) + vec_bytes(s.sout) +
             vec_bytes(s.sgate) + vec_bytes(s.dw) + vec_bytes(s.dx_routed) + vec_bytes(s.dx_shared);
  b += double(s.idx.size()) * sizeof(int) +
       double(s.counts_send.size() + s.counts_recv.size() + s.counts_recv_etp.size()) * sizeof(int64_t);
  for (const moe::ChunkBuffers& k : s.chunks) {
    for (const auto* v : {&k.xp, &k.xr, &k.xe, &k.h1, &k.act, &k.ye_src, &k.yp, &k.dyp, &k.dyr, &k.dye, &k.dh1,
                          &k.dx_src, &k.dxp})
      b += vec_bytes(*v);
    b += double(k.row_of_slot.size()) * sizeof(int) +
         double(k.send_by_expert.size() + k.recv_by_block.size() + k.etp_by_block.size()) * sizeof(int64_t) +
         double(k.send_counts.size() + k.send_displs.size() + k.recv_counts.size() + k.recv_displs.size()) *
             sizeof(size_t);
  }
  return b;
}

moe::ExecOptions moe_exec() {
  moe::ExecOptions o;
  o.overlap = true;
  o.poll_rows = 64;
  return o;
}

// Router logits with the kernel's own fixed-order GEMM, so the routing rebuilt from them in backward is the forward's.
void router_logits(Ctx& c, const moe::MoeWeights& mw, const float* x, float* logits) {
  moe::cpu::gemm_rows(x, mw.router.data(), logits, c.rows, c.d.H, c.d.moe.experts, nullptr,
                      int(std::max<int64_t>(1, c.rows)));
}

// The shared expert under TP, in fp32 like the kernel's own (moe_cpu.cpp SharedFwd / SharedBwd) so that TP changes
// only summation orders: its state is the analogue of the kernel's sh1, sact, sout and sgate and is charged with the
// MoE layer's buffers the same way (README "Memory mapping").
struct SharedTp {
  std::vector<float> h1, act, out, gate;
  double bytes() const { return vec_bytes(h1) + vec_bytes(act) + vec_bytes(out) + vec_bytes(gate); }
};

// Megatron SharedExpertMLP with sequence parallelism: the gate sigmoid(x . g) on this rank's rows, fc1
// column-parallel over the all-gathered tokens, fc2 row-parallel back to this rank's rows; y += gate * out.
void shared_fwd_tp(Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, float* y, SharedTp& s) {
  const int64_t T = c.tokens, R = c.rows, H = c.d.H, S = c.d.shared_local;
  WS w1 = widen(c.tr, wd(w, u.off.shared_w1), size_t(H * 2 * S)), w2 = widen(c.tr, wd(w, u.off.shared_w2), size_t(S * H));
  {
    const Rows x = sp_gather(c, n2, H);
    s.h1.resize(size_t(T * 2 * S));
    s.act.resize(size_t(T * S));
    moe::cpu::gemm_rows(x.p, w1.data(), s.h1.data(), T, int(H), int(2 * S), nullptr, int(std::max<int64_t>(1, T)));
  }
  swiglu_fwd(s.h1.data(), s.act.data(), T, S);
  WS partial = ws(c, size_t(T * H));
  moe::cpu::gemm_rows(s.act.data(), w2.data(), partial.data(), T, int(S), int(H), nullptr, int(std::max<int64_t>(1, T)));
  s.out.resize(size_t(R * H));
  sp_reduce_scatter(c, partial.data(), s.out.data(), H);
  if (c.d.shared_gate) {
    s.gate.resize(size_t(R));
    for (int64_t t = 0; t < R; ++t) {
      float z = 0;
      for (int64_t h = 0; h < H; ++h) z += n2[t * H + h] * bf16_to_float(w.dense[u.off.shared_gate + h]);
      s.gate[size_t(t)] = moe::sigmoid_(z);
    }
  }
  for (int64_t t = 0; t < R; ++t) {
    const float g = s.gate.empty() ? 1.0f : s.gate[size_t(t)];
    for (int64_t h = 0; h < H; ++h) y[t * H + h] += g * s.out[size_t(t * H + h)];
  }
}

// Its backward from the saved bf16 fc1 output and activation (the kernel's rebuild): the output and gate recomputed,
// then dgate, fc2 and fc1 backward; adds the input gradient to dn2 and the weight gradients to g.
void shared_bwd_tp(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSaved& sv,
                   const float* n2, const float* dy, float* dn2, SharedTp& s) {
  const int64_t T = c.tokens, R = c.rows, H = c.d.H, S = c.d.shared_local;
  const int blk = int(std::max<int64_t>(1, T));
  WS w1 = widen(c.tr, wd(w, u.off.shared_w1), size_t(H * 2 * S)), w2 = widen(c.tr, wd(w, u.off.shared_w2), size_t(S * H));
  s.h1.resize(sv.sh1.size());
  to_f32(sv.sh1.data(), s.h1.data(), s.h1.size());
  s.act.resize(sv.sact.size());
  to_f32(sv.sact.data(), s.act.data(), s.act.size());
  {
    WS partial = ws(c, size_t(T * H));
    moe::cpu::gemm_rows(s.act.data(), w2.data(), partial.data(), T, int(S), int(H), nullptr, blk);
    s.out.resize(size_t(R * H));
    sp_reduce_scatter(c, partial.data(), s.out.data(), H);
  }
  WS dso = ws(c, size_t(R * H));
  for (int64_t t = 0; t < R; ++t) {
    float gt = 1.0f;
    if (c.d.shared_gate) {
      float z = 0;
      for (int64_t h = 0; h < H; ++h) z += n2[t * H + h] * bf16_to_float(w.dense[u.off.shared_gate + h]);
      gt = moe::sigmoid_(z);
    }
    float dz = 0;
    for (int64_t h = 0; h < H; ++h) {
      dso[size_t(t * H + h)] = gt * dy[t * H + h];
      dz += dy[t * H + h] * s.out[size_t(t * H + h)];
    }
    if (c.d.shared_gate) {
      dz *= gt * (1.0f - gt);  // through the sigmoid gate
      for (int64_t h = 0; h < H; ++h) {
        g.dense[u.off.shared_gate + h] += dz * n2[t * H + h];
        dn2[t * H + h] += dz * bf16_to_float(w.dense[u.off.shared_gate + h]);
      }
    }
  }
  const Rows dso_all = sp_gather(c, dso.data(), H);
  WS dact = ws(c, size_t(T * S)), dh1 = ws(c, size_t(T * 2 * S));
  moe::cpu::gemm_at(s.act.data(), dso_all.p, g.dense + u.off.shared_w2, T, int(S), int(H));
  moe::cpu::gemm_rows_bt(dso_all.p, w2.data(), dact.data(), T, int(H), int(S), nullptr, blk);
  swiglu_back(s.h1.data(), dact.data(), dh1.data(), T, S);
  WS dx = ws(c, size_t(R * H));
  {
    const Rows x = sp_gather(c, n2, H);
    moe::cpu::gemm_at(x.p, dh1.data(), g.dense + u.off.shared_w1, T, int(H), int(2 * S));
    WS partial = ws(c, size_t(T * H));
    moe::cpu::gemm_rows_bt(dh1.data(), w1.data(), partial.data(), T, int(2 * S), int(H), nullptr, blk);
    sp_reduce_scatter(c, partial.data(), dx.data(), H);
  }
  for (int64_t i = 0; i < R * H; ++i) dn2[i] += dx[size_t(i)];
}

template <class F>
Buf<bf16> concat16(Ctx& c, const moe::MoeSaved& s, F member) {
  size_t n = 0;
  for (const auto& k : s.chunks) n += member(k).size();
  Buf<bf16> b(c.tr, Category::Activations, n);
  size_t at = 0;
  for (const auto& k : s.chunks) {
    to_bf16(member(k).data(), b.data() + at, member(k).size());
    at += member(k).size();
  }
  return b;
}

Buf<bf16> swiglu16(Ctx& c, const Buf<bf16>& h1, int64_t f) {
  HostOps o{c.tr};
  return impl::swiglu16(o, h1, f);
}

void moe_fwd(Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep, LayerSaved& sv, float* y) {
  const moe::MoeConfig& cfg = c.d.moe;
  const int64_t R = c.rows, E = cfg.experts;
  MoeW mw = moe_weights(c, u, w);
  moe::MoeSaved ms;
  // Routed experts on this rank's rows (sequence parallelism: Megatron's router and dispatcher see the SP shard).
  moe::moe_forward(c.pg.ep, c.pg.etp, cfg, mw.w, c.sched, n2, int(R), y, ms, moe_exec());
  SharedTp sh;
  if (c.tp > 1 && c.d.shared_local > 0) shared_fwd_tp(c, u, w, n2, y, sh);
  round_bf16_inplace(y, size_t(R * c.d.H));
  if (keep != Keep::InputOnly) {
    int64_t recv = 0;  // counted once per layer pass that keeps its tensors (a full-recompute rebuild, not both runs)
    for (const auto& k : ms.chunks) recv += int64_t(k.xe.size()) / c.d.H;
    c.moe_rows_received += double(recv);
    c.moe_rows_sent += double(R) * cfg.top_k;
    sv.logits = Buf<float>(c.tr, Category::Activations, size_t(R * E));
    router_logits(c, mw.w, n2, sv.logits.data());
    sv.probs = save32(c, ms.scores.data(), ms.scores.size());
    sv.xe = concat16(c, ms, [](const moe::ChunkBuffers& k) -> const std::vector<float>& { return k.xe; });
    sv.yp = concat16(c, ms, [](const moe::ChunkBuffers& k) -> const std::vector<float>& { return k.yp; });
    sv.h1 = concat16(c, ms, [](const moe::ChunkBuffers& k) -> const std::vector<float>& { return k.h1; });
    // The kernel keeps its activations in fp32; the saved ones are SwiGLU of the saved (bf16) fc1 outputs, rounded:
    // exactly what selective recompute rebuilds, so every recompute mode backpropagates the same values.
    if (keep == Keep::All) sv.eact = swiglu16(c, sv.h1, mw.w.ffn_local);
    const std::vector<float>& sh1 = c.tp > 1 ? sh.h1 : ms.sh1;
    if (!sh1.empty()) {
      sv.sh1 = save16(c, sh1.data(), sh1.size());
      if (keep == Keep::All) sv.sact = swiglu16(c, sv.sh1, c.d.shared_local);
    }
    // Counts per (peer, chunk, local expert), and under ETP every ETP rank's: what the backward's all-to-alls and
    // ETP gathers need without exchanging them again.
    sv.moe_meta = Buf<int64_t>(c.tr, Category::Activations, ms.counts_recv.size() + ms.counts_recv_etp.size());
    std::copy(ms.counts_recv.begin(), ms.counts_recv.end(), sv.moe_meta.data());
    std::copy(ms.counts_recv_etp.begin(), ms.counts_recv_etp.end(), sv.moe_meta.data() + ms.counts_recv.size());
  }
  // The kernel's buffers are alive together with everything saved so far: that moment is the forward's MoE peak.
  Tracker::Charge buffers(c.tr, Category::MoeBuffers, moe_state_bytes(ms) + sh.bytes());
}

void moe_bwd(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, LayerSaved& sv, const float* n2,
             const float* dy, float* dn2) {
  const moe::MoeConfig& cfg = c.d.moe;
  const int64_t T = c.rows, H = cfg.hidden, E = cfg.experts, K = cfg.top_k, S = cfg.shared_ffn;
  const int P = c.pg.ep.size, N = c.sched.chunks, L = cfg.experts / P, Q = c.pg.etp.size;
  MoeW mw = moe_weights(c, u, w);
  const int64_t F = mw.w.ffn_local;
  // Rebuild the kernel's saved state from the bf16 tensors and the routing (recomputed from the saved logits).
  moe::MoeSaved ms;
  ms.tokens = int(T);
  ms.x = n2;
  ms.scores.assign(sv.probs.data(), sv.probs.data() + sv.probs.size());
  ms.idx.resize(size_t(T * K));
  ms.w.resize(size_t(T * K));
  {
    const moe::RouterParams rp = moe::router_params(cfg);
    std::vector<float> scratch(static_cast<size_t>(E), 0.0f);
    const float* bias = cfg.router == moe::Router::SigmoidGroupLimited ? mw.w.expert_bias.data() : nullptr;
    for (int64_t t = 0; t < T; ++t)
      moe::route_token(rp, sv.logits.data() + t * E, bias, scratch.data(), &ms.idx[size_t(t * K)], &ms.w[size_t(t * K)]);
  }
  const size_t own = size_t(P) * N * L;
  ms.counts_recv.assign(sv.moe_meta.data(), sv.moe_meta.data() + own);
  if (Q > 1) ms.counts_recv_etp.assign(sv.moe_meta.data() + own, sv.moe_meta.data() + sv.moe_meta.size());
  moe::restore_routing(cfg, mw.w, P, Q, c.sched, ms);
  size_t xe_at = 0, yp_at = 0, h1_at = 0, act_at = 0;
  auto take = [](const Buf<bf16>& src, size_t& at, size_t n_el) {
    std::vector<float> v(n_el);
    to_f32(src.data() + at, v.data(), n_el);
    at += n_el;
    return v;
  };
  for (moe::ChunkBuffers& b : ms.chunks) {
    size_t rows = 0;  // rows the expert GEMMs ran on (every ETP rank's under ETP)
    for (int64_t n : b.etp_by_block) rows += size_t(n);
    b.xe = take(sv.xe, xe_at, rows * H);
    b.h1 = take(sv.h1, h1_at, rows * 2 * F);
    b.act = take(sv.eact, act_at, rows * F);
    b.yp = take(sv.yp, yp_at, b.row_of_slot.size() * H);
  }
  if (S) {
    ms.sh1.resize(sv.sh1.size());
    to_f32(sv.sh1.data(), ms.sh1.data(), sv.sh1.size());
    ms.sact.resize(sv.sact.size());
    to_f32(sv.sact.data(), ms.sact.data(), sv.sact.size());
    ms.sout.resize(size_t(T * H));  // the shared expert's output, recomputed with the kernel's GEMM (not saved)
    moe::cpu::gemm_rows(ms.sact.data(), mw.w.shared_w2.data(), ms.sout.data(), T, int(S), int(H), nullptr,
                        int(std::max<int64_t>(1, T)));
    if (cfg.shared_gate) {
      ms.sgate.resize(size_t(T));
      for (int64_t t = 0; t < T; ++t) {
        float zz = 0;
        for (int64_t h = 0; h < H; ++h) zz += n2[t * H + h] * mw.w.shared_gate[size_t(h)];
        ms.sgate[size_t(t)] = moe::sigmoid_(zz);
      }
    }
  }
  moe::MoeWeights mg;
  moe::moe_backward(c.pg.ep, c.pg.etp, cfg, mw.w, c.sched, ms, dy, dn2, mg, moe_exec());
  SharedTp sh;
  if (c.tp > 1 && c.d.shared_local > 0) shared_bwd_tp(c, u, w, g, sv, n2, dy, dn2, sh);
  double gbytes = 0;
  for (const auto* v : {&mg.router, &mg.expert_bias, &mg.w1, &mg.w2, &mg.shared_w1, &mg.shared_w2, &mg.shared_gate})
    gbytes += vec_bytes(*v);
  Tracker::Charge buffers(c.tr, Category::MoeBuffers, moe_state_bytes(ms) + sh.bytes());
  Tracker::Charge grads(c.tr, Category::Workspace, gbytes);
  auto acc = [](float* dst, const std::vector<float>& src) {
    for (size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
  };
  acc(g.dense + u.off.router, mg.router);  // the expert bias is steered by balancing, not by gradient (kernel: zero)
  if (S) {
    acc(g.dense + u.off.shared_w1, mg.shared_w1);
    acc(g.dense + u.off.shared_w2, mg.shared_w2);
  }
  if (cfg.shared_gate) acc(g.dense + u.off.shared_gate, mg.shared_gate);
  acc(g.expert + u.off.w1, mg.w1);
  acc(g.expert + u.off.w2, mg.w2);
}

// ---------------------------------------------------------------- the loss

// Materialized cross-entropy over a vocabulary shard (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py,
// _VocabParallelCrossEntropy): fp32 logits [tokens x vocab/tp], the row maximum, the sum of exponentials and the
// target logit each all-reduced over TP; the gradient softmax - onehot replaces the logits in the same buffer, as the
// single-rank path holds one fp32 tokens x vocab buffer at a time (the estimator's logits term).
double vocab_parallel_ce(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                         float* dh, float* dW) {
  const int64_t T = c.tokens, H = c.d.H, V = c.d.Vl, V0 = c.d.V0;
  Buf<float> lg(c.tr, Category::Logits, size_t(T * V));
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> L(lg.data(), T, V);
  using CMap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  L.noalias() = CMap(h, T, H) * CMap(W, V, H).transpose();
  WS mx = ws(c, size_t(T)), st = ws(c, size_t(2 * T));  // per token: max; sum of exp, target logit
  for (int64_t t = 0; t < T; ++t) mx[size_t(t)] = *std::max_element(lg.data() + t * V, lg.data() + (t + 1) * V);
  comm::all_reduce(c.pg.tp, mx.data(), size_t(T), comm::DType::F32, comm::ReduceOp::Max);
  for (int64_t t = 0; t < T; ++t) {
    float se = 0.0f;
    for (int64_t v = 0; v < V; ++v) se += std::exp(lg[size_t(t * V + v)] - mx[size_t(t)]);
    st[size_t(t)] = se;
    const int64_t y = targets[t] - V0;
    st[size_t(T + t)] = y >= 0 && y < V ? lg[size_t(t * V + y)] : 0.0f;
  }
  comm::all_reduce(c.pg.tp, st.data(), size_t(2 * T), comm::DType::F32, comm::ReduceOp::Sum);
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    lse[t] = mx[size_t(t)] + std::log(st[size_t(t)]);
    loss += linear_ce::token_loss(lse[t], st[size_t(T + t)], 0.0f);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v)
      lg[size_t(t * V + v)] = linear_ce::logit_grad(lg[size_t(t * V + v)], lse[t], v + V0 == targets[t], gl, 0.0f, 0.0f);
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(dh, T, H).noalias() =
      L * CMap(W, V, H);
  comm::all_reduce(c.pg.tp, dh, size_t(T * H), comm::DType::F32, comm::ReduceOp::Sum);  // d_hidden: summed over shards
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(dW, V, H).noalias() =
      L.transpose() * CMap(h, T, H);
  return loss;
}

}  // namespace

// ---------------------------------------------------------------- HostOps (layer_ops_host.h)

void HostOps::row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n) {
  exec::row_parallel(c, x, W, y, k, n);
}
void HostOps::col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW,
                               int64_t k, int64_t n) {
  exec::col_parallel_bwd(c, x_all, W, dy, dx, dW, k, n);
}

void HostOps::attention_fwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v, float* o,
                            float* lse, const attention::Options& opt) {
  attention::Stats st;
  attention::forward_cpu(s, q, k, v, o, lse, opt, &st);
  Tracker::Charge scratch(c.tr, Category::Workspace, double(st.peak_extra_bytes));
}

void HostOps::attention_bwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                            const attention::Options& opt) {
  attention::Stats st;
  attention::backward_cpu(s, q, k, v, o, lse, d_o, dq, dk, dv, opt, &st);
  Tracker::Charge scratch(c.tr, Category::Workspace, double(st.peak_extra_bytes));
}

double HostOps::cross_entropy(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                              Buf<float>& dh, Buf<float>& dW) {
  const int64_t T = c.tokens, H = c.d.H, V = c.d.Vl;
  const bool vp = c.tp > 1;  // vocabulary-parallel LM head
  const impl::CeCall ce = impl::ce_call(c);
  const linear_ce::Problem& p = ce.p;
  const linear_ce::Options& o = ce.o;
  float loss = 0;
  linear_ce::Stats st;
  const auto F32 = linear_ce::DType::F32;
  if (c.linear_ce) {
    if (vp) linear_ce::forward_vocab_parallel_cpu(c.pg.tp, p, F32, h, W, targets, &loss, lse, o, &st);
    else linear_ce::forward_cpu(p, F32, h, W, targets, &loss, lse, o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
    dh = Buf<float>(c.tr, Category::Logits, size_t(T * H));
    dW = ws(size_t(V * H));
    if (vp)
      linear_ce::backward_vocab_parallel_cpu(c.pg.tp, p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    else
      linear_ce::backward_cpu(p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
  } else if (vp) {
    dh = Buf<float>(c.tr, Category::Workspace, size_t(T * H));
    dW = ws(size_t(V * H));
    loss = float(vocab_parallel_ce(c, h, W, targets, gl, lse, dh.data(), dW.data()));
  } else {
    linear_ce::forward_naive_cpu(p, F32, h, W, targets, &loss, lse, o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
    dh = Buf<float>(c.tr, Category::Workspace, size_t(T * H));
    dW = ws(size_t(V * H));
    linear_ce::backward_naive_cpu(p, F32, h, W, targets, lse, &gl, dh.data(), dW.data(), o, &st);
    { Tracker::Charge scratch(c.tr, Category::Logits, double(st.peak_extra_bytes)); }
  }
  return loss;
}

void HostOps::moe_fwd(Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep, LayerSaved& sv,
                      float* y) {
  exec::moe_fwd(c, u, w, n2, keep, sv, y);
}
void HostOps::moe_bwd(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, LayerSaved& sv,
                      const float* n2, const float* dy, float* dn2) {
  exec::moe_bwd(c, u, w, g, sv, n2, dy, dn2);
}

// ---------------------------------------------------------------- layers.h: the host instance of executor/layers/

void layer_forward(Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep, LayerSaved& sv,
                   float* out) {
  HostOps o{c.tr};
  impl::layer_forward(o, c, u, w, l, keep, sv, out);
}

void layer_backward(Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSpec& l, Keep keep,
                    LayerSaved& sv, const float* dout, float* dx) {
  HostOps o{c.tr};
  impl::layer_backward(o, c, u, w, g, l, keep, sv, dout, dx);
}

double loss_forward_backward(Ctx& c, const bf16* fn_w, const bf16* head_w, float* fn_g, float* head_g, const float* x,
                             const int64_t* targets, double grad_scale, float* dx) {
  HostOps o{c.tr};
  return impl::loss_forward_backward(o, c, fn_w, head_w, fn_g, head_g, x, targets, grad_scale, dx);
}

void embedding_forward(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  HostOps o{c.tr};
  impl::embedding_forward(o, c, table, tokens, x);
}

void embedding_backward(Ctx& c, const int64_t* tokens, const float* dx, float* g) {
  HostOps o{c.tr};
  impl::embedding_backward(o, c, tokens, dx, g);
}

}  // namespace lcplan::exec