// The MoE FFN of a decoder layer over an Ops (common.h): router, routed experts and shared expert are kernels/moe's
// chunked expert-parallel layer (moe_pass.h, the one orchestration of both backends and of the CPU layer), run on this
// rank's rows with the plan's chunk schedule. Around it: the weights widened from the bf16 unit, the tensors the
// estimator counts saved as activations (bf16, the router's logits and probabilities fp32) and, before the backward,
// the layer's state rebuilt from them, the routing recomputed from the saved logits. The layer's state is its MoE
// buffers, alive from the routing to the end of the pass (README "Memory mapping").
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "executor/layers/common.h"
#include "executor/layers/mlp.h"
#include "kernels/moe/moe_pass.h"

namespace lcplan::exec::impl {

// The layer's configuration as the pass runs it: the shared expert's columns on this TP rank (all of them without
// TP), gated as the model says.
inline moe::MoeConfig moe_config(const Ctx& c) {
  moe::MoeConfig cfg = c.d.moe;
  cfg.shared_ffn = int(c.d.shared_local);
  cfg.shared_gate = c.d.shared_local > 0 && c.d.shared_gate;
  return cfg;
}

// The unit's weights widened to fp32 workspace, where the pass reads them.
template <class Ops>
struct MoeWeights32 {
  WsOf<Ops> router, bias, w1, w2, shared_w1, shared_w2, shared_gate;
  moe::MoeParams p;
};

template <class Ops>
MoeWeights32<Ops> moe_weights(Ops& o, const moe::MoeCall& a, const UnitLayout& u, const UnitView& w) {
  const size_t H = size_t(a.cfg.hidden), E = size_t(a.cfg.experts), F = size_t(a.ffn()),
               S = size_t(a.cfg.shared_ffn), L = size_t(a.local_experts());
  MoeWeights32<Ops> r;
  r.router = o.widen(wd(w, u.off.router), H * E);
  if (a.cfg.router == moe::Router::SigmoidGroupLimited) r.bias = o.widen(wd(w, u.off.expert_bias), E);
  r.w1 = o.widen(w.expert + u.off.w1, L * H * 2 * F);
  r.w2 = o.widen(w.expert + u.off.w2, L * F * H);
  if (S) {
    r.shared_w1 = o.widen(wd(w, u.off.shared_w1), H * 2 * S);
    r.shared_w2 = o.widen(wd(w, u.off.shared_w2), S * H);
  }
  if (a.cfg.shared_gate) r.shared_gate = o.widen(wd(w, u.off.shared_gate), H);
  r.p = {r.router.data(), r.bias.empty() ? nullptr : r.bias.data(), r.w1.data(), r.w2.data(), r.shared_w1.data(),
         r.shared_w2.data(), r.shared_gate.data()};
  return r;
}

// The unit's gradients the pass accumulates into.
inline moe::MoeGrads moe_grads(const UnitLayout& u, const UnitGrad& g) {
  return {gd(g, u.off.router), g.expert + u.off.w1, g.expert + u.off.w2, gd(g, u.off.shared_w1),
          gd(g, u.off.shared_w2), gd(g, u.off.shared_gate)};
}

// One member of every chunk, rounded to bf16 one chunk after another: a saved activation.
template <class Ops, class Member>
typename Ops::template Buf<bf16> concat16(Ops& o, Ctx& c, moe::MoeState<Ops>& st, Member member) {
  size_t n = 0;
  for (auto& k : st.chunks) n += (k.*member).size();
  typename Ops::template Buf<bf16> out(c.tr, Category::Activations, n);
  size_t at = 0;
  for (auto& k : st.chunks) {
    o.to_bf16((k.*member).data(), out.data() + at, (k.*member).size());
    at += (k.*member).size();
  }
  return out;
}

// The next n values of a saved bf16 tensor, widened into a state buffer of the pass.
template <class Ops>
WsOf<Ops> take(Ops& o, const typename Ops::template Buf<bf16>& src, size_t& at, size_t n) {
  WsOf<Ops> b = o.template moe_buf<float>(n);
  if (n) o.to_f32(src.data() + at, b.data(), n);
  at += n;
  return b;
}

// What the forward keeps (the estimator's list): the router's logits and probabilities (fp32), the experts' inputs,
// outputs and fc1 outputs (bf16) and, unless selective recompute drops them, the activations, which are SwiGLU of
// the saved fc1 outputs, rounded: what selective recompute rebuilds, so every mode backpropagates the same values.
template <class Ops>
void save_moe(Ops& o, Ctx& c, Keep keep, moe::MoeState<Ops>& st, WsOf<Ops>&& logits,
              BasicLayerSaved<Ops::template Buf>& sv) {
  using Chunk = moe::MoeChunk<Ops>;
  sv.logits = std::move(logits);
  sv.probs = o.save32(st.scores.data(), st.scores.size());
  sv.xe = concat16(o, c, st, &Chunk::xe);
  sv.yp = concat16(o, c, st, &Chunk::yp);
  sv.h1 = concat16(o, c, st, &Chunk::h1);
  if (keep == Keep::All) sv.eact = swiglu16(o, sv.h1, c.d.moe.expert_ffn / c.d.etp);
  if (!st.sh1.empty()) {
    sv.sh1 = o.save16(st.sh1.data(), st.sh1.size());
    if (keep == Keep::All) sv.sact = swiglu16(o, sv.sh1, c.d.shared_local);
  }
  // Counts per (peer, chunk, local expert), and under ETP every ETP rank's: what the backward's all-to-alls and ETP
  // gathers need without exchanging them again.
  std::vector<int64_t> meta = st.counts_recv;
  meta.insert(meta.end(), st.counts_recv_etp.begin(), st.counts_recv_etp.end());
  sv.moe_meta = o.save_counts(meta);
}

template <class Ops>
void moe_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep,
             BasicLayerSaved<Ops::template Buf>& sv, float* y) {
  const moe::MoeConfig cfg = moe_config(c);
  const moe::MoeCall a{cfg, c.sched, c.pg.ep, c.pg.etp, c.pg.tp, int(c.rows)};
  moe::check_call(a);
  const MoeWeights32<Ops> W = moe_weights(o, a, u, w);
  // Routed experts on this rank's rows (sequence parallelism: Megatron's router and dispatcher see the SP shard).
  WsOf<Ops> logits(c.tr, keep == Keep::InputOnly ? Category::Workspace : Category::Activations,
                   size_t(c.rows * cfg.experts));
  moe::router_logits(o, a, W.p, n2, logits.data());
  moe::MoeState<Ops> st;
  moe::route(o, a, W.p, logits.data(), st);
  moe::plan_chunks(o, a, st, true);
  moe::forward(o, a, W.p, st, n2, y);
  o.round(y, size_t(c.rows * cfg.hidden));
  if (keep == Keep::InputOnly) return;
  // Counted once per layer pass that keeps its tensors (a full-recompute rebuild, not both runs).
  c.moe_rows_received += double(st.gemm_rows());
  c.moe_rows_sent += double(c.rows) * cfg.top_k;
  save_moe(o, c, keep, st, std::move(logits), sv);
}  // the state goes here, after everything saved: that moment is the forward's MoE peak

// The forward's state rebuilt from the saved tensors: its routing from the saved logits and receive counts, the
// experts' buffers widened from their bf16 copies, the shared expert's output recomputed (it is not saved).
template <class Ops>
void restore_moe(Ops& o, const moe::MoeCall& a, const moe::MoeParams& p, BasicLayerSaved<Ops::template Buf>& sv,
                 const float* n2, moe::MoeState<Ops>& st) {
  moe::route(o, a, p, sv.logits.data(), st);
  const std::vector<int64_t> meta = o.load_counts(sv.moe_meta);
  const size_t own = size_t(a.ep.size) * size_t(a.sched.chunks) * size_t(a.local_experts());
  st.counts_recv.assign(meta.begin(), meta.begin() + ptrdiff_t(own));
  st.counts_recv_etp.assign(meta.begin() + ptrdiff_t(own), meta.end());
  moe::plan_chunks(o, a, st, false);
  const size_t H = size_t(a.cfg.hidden), K = size_t(a.cfg.top_k), F = size_t(a.ffn());
  size_t xe_at = 0, h1_at = 0, act_at = 0, yp_at = 0;
  for (moe::MoeChunk<Ops>& b : st.chunks) {
    const size_t rows = size_t(b.gemm.rows());  // every ETP rank's under ETP
    b.xe = take(o, sv.xe, xe_at, rows * H);
    b.h1 = take(o, sv.h1, h1_at, rows * 2 * F);
    b.act = take(o, sv.eact, act_at, rows * F);
    b.yp = take(o, sv.yp, yp_at, size_t(b.tokens()) * K * H);
  }
  if (a.cfg.shared_ffn == 0) return;
  size_t at = 0;
  st.sh1 = take(o, sv.sh1, at, sv.sh1.size());
  at = 0;
  st.sact = take(o, sv.sact, at, sv.sact.size());
  moe::shared_out(o, a, p, st, n2);
}

template <class Ops>
void moe_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
             BasicLayerSaved<Ops::template Buf>& sv, const float* n2, const float* dy, float* dn2) {
  const moe::MoeConfig cfg = moe_config(c);
  const moe::MoeCall a{cfg, c.sched, c.pg.ep, c.pg.etp, c.pg.tp, int(c.rows)};
  const MoeWeights32<Ops> W = moe_weights(o, a, u, w);
  moe::MoeState<Ops> st;
  restore_moe(o, a, W.p, sv, n2, st);
  moe::backward(o, a, W.p, moe_grads(u, g), st, n2, dy, dn2);
}

}  // namespace lcplan::exec::impl
