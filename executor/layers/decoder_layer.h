// One decoder layer over an Ops (common.h): norm, mixer (attention.h, mla.h, gdn.h), residual, norm, FFN (mlp.h or
// moe.h), residual; its backward, with what the plan's recompute mode dropped rebuilt first.
#pragma once

#include <cstdint>

#include "executor/layers/attention.h"
#include "executor/layers/gdn.h"
#include "executor/layers/mla.h"
#include "executor/layers/mlp.h"
#include "executor/layers/moe.h"

namespace lcplan::exec::impl {

// Rebuilds what selective recompute dropped (norm outputs, core attention's lse, the MLP activations), as
// activations of the layer being backpropagated (estimator: the rebuilt working set).
template <class Ops>
void rebuild_selective(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l,
                       BasicLayerSaved<Ops::template Buf>& sv) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, R = c.rows, H = d.H;
  WsOf<Ops> x = o.load(sv.x);
  WsOf<Ops> n1 = o.ws(size_t(R * H));
  o.rmsnorm(x.data(), wd(w, u.off.norm1), n1.data(), R, H);
  o.round(n1.data(), n1.size());
  sv.n1 = o.save16(n1.data(), n1.size());
  WsOf<Ops> y = o.ws(size_t(R * H));
  if (l.mixer == MixerKind::FullAttention) {
    WsOf<Ops> q = o.load(sv.q), k = o.load(sv.k), v = o.load(sv.v), out = o.ws(size_t(T * d.q_cols()));
    sv.lse = WsOf<Ops>(c.tr, Category::Activations, size_t(T * d.hq));
    core_attention_fwd(o, c, l.sliding, q.data(), k.data(), v.data(), out.data(), sv.lse.data());
    WsOf<Ops> go = o.load(d.gate ? sv.go : sv.o);
    o.row_parallel(c, go.data(), wd(w, u.off.wo), y.data(), d.q_cols(), H);
  } else if (l.mixer == MixerKind::MLA) {
    WsOf<Ops> q = o.load(sv.q), k = o.load(sv.k), out = o.ws(size_t(T * d.q_cols()));
    WsOf<Ops> vp;
    {
      WsOf<Ops> v = o.load(sv.v);
      vp = mla_pad_v(o, c, v.data());
    }
    sv.lse = WsOf<Ops>(c.tr, Category::Activations, size_t(T * d.hq));
    core_attention_fwd(o, c, false, q.data(), k.data(), vp.data(), out.data(), sv.lse.data());
    WsOf<Ops> ov = o.load(sv.o);
    o.row_parallel(c, ov.data(), wd(w, u.off.wo), y.data(), d.mla_v_cols(), H);
  } else {
    WsOf<Ops> gn = o.load(sv.gn);
    o.row_parallel(c, gn.data(), wd(w, u.off.w_out), y.data(), d.vdim(), H);
  }
  o.round(y.data(), y.size());
  o.residual(x.data(), y.data(), y.data(), size_t(R * H));
  sv.r = o.save16(y.data(), y.size());
  if (l.ffn == FfnKind::Dense) {
    WsOf<Ops> h1 = o.load(sv.fc1), act = o.ws(size_t(T * d.F));
    o.swiglu_fwd(h1.data(), act.data(), T, d.F);
    sv.act = o.save16(act.data(), act.size());
  } else {
    sv.eact = swiglu16(o, sv.h1, d.moe.expert_ffn / d.etp);
    if (!sv.sh1.empty()) sv.sact = swiglu16(o, sv.sh1, d.shared_local);
  }
}


template <class Ops>
void mixer_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, const float* x, Keep keep,
               BasicLayerSaved<Ops::template Buf>& sv, const WsOf<Ops>* rebuild_state, float* y) {
  if (l.mixer == MixerKind::FullAttention) attention_fwd(o, c, u, w, l, x, keep, sv, y);
  else if (l.mixer == MixerKind::MLA) mla_fwd(o, c, u, w, x, keep, sv, y);
  else gdn_fwd(o, c, u, w, x, keep, sv, rebuild_state, y);
}

template <class Ops>
void ffn_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, const float* n2, Keep keep,
             BasicLayerSaved<Ops::template Buf>& sv, float* y) {
  if (l.ffn == FfnKind::Dense) mlp_fwd(o, c, u, w, n2, keep, sv, y);
  else moe_fwd(o, c, u, w, n2, keep, sv, y);
}

template <class Ops>
void layer_forward(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep,
                   BasicLayerSaved<Ops::template Buf>& sv, float* out) {
  const int64_t T = c.rows, H = c.d.H;
  WsOf<Ops> x = o.load(sv.x);
  WsOf<Ops> y = o.ws(size_t(T * H));
  mixer_fwd(o, c, u, w, l, x.data(), keep, sv, nullptr, y.data());
  WsOf<Ops> r = o.ws(size_t(T * H));
  o.residual(x.data(), y.data(), r.data(), size_t(T * H));
  x.reset();
  WsOf<Ops> n2 = o.ws(size_t(T * H));
  o.rmsnorm(r.data(), wd(w, u.off.norm2), n2.data(), T, H);
  o.round(n2.data(), n2.size());
  if (keep == Keep::All) sv.r = o.save16(r.data(), r.size());
  ffn_fwd(o, c, u, w, l, n2.data(), keep, sv, y.data());
  o.residual(r.data(), y.data(), out, size_t(T * H));
}

template <class Ops>
void layer_backward(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSpec& l,
                    Keep keep, BasicLayerSaved<Ops::template Buf>& sv_in, const float* dout, float* dx) {
  using Saved = BasicLayerSaved<Ops::template Buf>;
  const int64_t T = c.rows, H = c.d.H;
  Saved rebuilt;
  Saved* sv = &sv_in;
  if (keep == Keep::InputOnly) {
    // Full recompute: the layer runs forward again from its saved input, keeping everything, then backward.
    WsOf<Ops> x = o.load(sv_in.x);
    WsOf<Ops> y = o.ws(size_t(T * H));
    mixer_fwd(o, c, u, w, l, x.data(), Keep::All, rebuilt, &sv_in.cp_state, y.data());
    WsOf<Ops> r = o.ws(size_t(T * H));
    o.residual(x.data(), y.data(), r.data(), size_t(T * H));
    WsOf<Ops> n2 = o.ws(size_t(T * H));
    o.rmsnorm(r.data(), wd(w, u.off.norm2), n2.data(), T, H);
    o.round(n2.data(), n2.size());
    rebuilt.r = o.save16(r.data(), r.size());
    ffn_fwd(o, c, u, w, l, n2.data(), Keep::All, rebuilt, y.data());
    rebuilt.cp_state = std::move(sv_in.cp_state);
    rebuilt.x = std::move(sv_in.x);
    sv = &rebuilt;
  } else if (keep == Keep::Selective) {
    rebuild_selective(o, c, u, w, l, sv_in);
  }
  Saved& s = *sv;
  // FFN: dR = dout + norm2_bwd(ffn_bwd(dout))
  WsOf<Ops> r = o.load(s.r);
  WsOf<Ops> n2 = o.ws(size_t(T * H));
  o.rmsnorm(r.data(), wd(w, u.off.norm2), n2.data(), T, H);
  o.round(n2.data(), n2.size());
  WsOf<Ops> dn2 = o.ws(size_t(T * H));
  if (l.ffn == FfnKind::Dense) mlp_bwd(o, c, u, w, g, s, n2.data(), dout, dn2.data());
  else moe_bwd(o, c, u, w, g, s, n2.data(), dout, dn2.data());
  WsOf<Ops> dr = o.ws(size_t(T * H));
  o.copy(dout, size_t(T * H), dr.data());
  o.rmsnorm_bwd(r.data(), wd(w, u.off.norm2), dn2.data(), dr.data(), gd(g, u.off.norm2), T, H, true);
  r.reset();
  n2.reset();
  dn2.reset();
  // mixer: dx = dR + norm1_bwd(mixer_bwd(dR))
  WsOf<Ops> dn1 = o.ws(size_t(T * H));
  if (l.mixer == MixerKind::FullAttention) attention_bwd(o, c, u, w, g, l, s, dr.data(), dn1.data());
  else if (l.mixer == MixerKind::MLA) mla_bwd(o, c, u, w, g, s, dr.data(), dn1.data());
  else gdn_bwd(o, c, u, w, g, s, dr.data(), dn1.data());
  WsOf<Ops> x = o.load(s.x);
  o.copy(dr.data(), size_t(T * H), dx);
  o.rmsnorm_bwd(x.data(), wd(w, u.off.norm1), dn1.data(), dx, gd(g, u.off.norm1), T, H, true);
  sv_in = Saved{};
  rebuilt = Saved{};
}

}  // namespace lcplan::exec::impl
