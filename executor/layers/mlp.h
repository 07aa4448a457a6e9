// The dense SwiGLU MLP (column-parallel fc1, row-parallel fc2), forward and backward over an Ops (common.h), and the
// bf16 SwiGLU of saved fc1 outputs that the MoE layer and selective recompute share.
#pragma once

#include <cstdint>

#include "executor/layers/common.h"

namespace lcplan::exec::impl {

template <class Ops>
void mlp_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* n2, Keep keep,
             BasicLayerSaved<Ops::template Buf>& sv, float* y) {
  const int64_t T = c.tokens, H = c.d.H, F = c.d.F;
  WsOf<Ops> h1 = o.ws(size_t(T * 2 * F)), act = o.ws(size_t(T * F));
  o.matmul(sp_gather(o, c, n2, H).p, wd(w, u.off.mlp_w1), h1.data(), T, H, 2 * F);
  o.round(h1.data(), h1.size());
  o.swiglu_fwd(h1.data(), act.data(), T, F);
  o.round(act.data(), act.size());
  o.row_parallel(c, act.data(), wd(w, u.off.mlp_w2), y, F, H);
  o.round(y, size_t(c.rows * H));
  if (keep == Keep::InputOnly) return;
  sv.fc1 = o.save16(h1.data(), h1.size());
  if (keep == Keep::All) sv.act = o.save16(act.data(), act.size());
}

template <class Ops>
void mlp_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
             BasicLayerSaved<Ops::template Buf>& sv, const float* n2, const float* dy, float* dn2) {
  const int64_t T = c.tokens, H = c.d.H, F = c.d.F;
  WsOf<Ops> act = o.load(sv.act), h1 = o.load(sv.fc1);
  WsOf<Ops> dact = o.ws(size_t(T * F)), dh1 = o.ws(size_t(T * 2 * F));
  row_parallel_bwd(o, c, act.data(), wd(w, u.off.mlp_w2), dy, dact.data(), gd(g, u.off.mlp_w2), F, H);
  o.swiglu_back(h1.data(), dact.data(), dh1.data(), T, F);
  o.col_parallel_bwd(c, sp_gather(o, c, n2, H).p, wd(w, u.off.mlp_w1), dh1.data(), dn2, gd(g, u.off.mlp_w1), H,
                     2 * F);
}

// bf16(SwiGLU(h1)) of bf16 fc1 outputs [rows x 2f], as saved activations.
template <class Ops>
typename Ops::template Buf<bf16> swiglu16(Ops& o, const typename Ops::template Buf<bf16>& h1, int64_t f) {
  const int64_t rows = int64_t(h1.size()) / (2 * f);
  WsOf<Ops> x = o.load(h1), act = o.ws(size_t(rows * f));
  o.swiglu_fwd(x.data(), act.data(), rows, f);
  return o.save16(act.data(), act.size());
}

}  // namespace lcplan::exec::impl
