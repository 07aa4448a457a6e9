// The loss over an Ops (common.h): final norm, the vocabulary-parallel LM head and cross-entropy (kernels/linear_ce),
// forward and backward in one call.
#pragma once

#include <algorithm>
#include <cstdint>

#include "executor/layers/common.h"
#include "kernels/linear_ce/linear_ce.h"

namespace lcplan::exec::impl {

// The loss kernel's call as the executor makes it on both backends: this rank's vocabulary shard (all of it without
// TP), every local token in one token tile (the estimator's tokens x tile term), the executor's vocabulary tile.
struct CeCall {
  linear_ce::Problem p;
  linear_ce::Options o;
};
inline CeCall ce_call(const Ctx& c) {
  CeCall r;
  r.p.tokens = c.tokens;
  r.p.hidden = c.d.H;
  r.p.vocab = c.d.Vl;
  if (c.tp > 1) {
    r.p.vocab_start = c.d.V0;
    r.p.vocab_total = c.d.V;
  }
  r.o.reduction = linear_ce::Reduction::Sum;
  r.o.vocab_tile = std::min<int64_t>(c.ce_vocab_tile, c.d.Vl);
  r.o.token_tile = std::max<int64_t>(1, c.tokens);
  return r;
}

template <class Ops>
double loss_forward_backward(Ops& o, Ctx& c, const bf16* fn_w, const bf16* head_w, float* fn_g, float* head_g,
                             const float* x, const int64_t* targets, double grad_scale, float* dx) {
  const int64_t T = c.tokens, R = c.rows, H = c.d.H, V = c.d.Vl;
  WsOf<Ops> h = o.ws(size_t(R * H));
  o.rmsnorm(x, fn_w, h.data(), R, H);
  o.round(h.data(), h.size());
  const Rows<Ops> hall = sp_gather(o, c, h.data(), H);  // the LM head sees every local token (Megatron gathers first)
  WsOf<Ops> W = o.widen(head_w, size_t(V * H));
  WsOf<Ops> lse(c.tr, Category::Logits, size_t(T));
  // Linear CE's fp32 d_hidden accumulator is a logits term of the estimator; the materialized path's is an ordinary
  // activation gradient (workspace). Both hold every local token's (summed over the vocabulary shards).
  WsOf<Ops> dh, dW;
  const double loss = o.cross_entropy(c, hall.p, W.data(), targets, float(grad_scale), lse.data(), dh, dW);
  o.accumulate(dW.data(), head_g, size_t(V * H));
  // This rank's rows of d_hidden (sequence parallelism: the gather's backward keeps the rank's own part).
  o.rmsnorm_bwd(x, fn_w, dh.data() + int64_t(c.tp_rank) * R * H, dx, fn_g, R, H, false);
  return loss;
}

}  // namespace lcplan::exec::impl
