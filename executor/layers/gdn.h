// The gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention) with its state passed along the CP ranks,
// forward and backward over an Ops (common.h).
#pragma once

#include <cstdint>
#include <stdexcept>

#include "executor/layers/common.h"
#include "kernels/linear_attention/linear_attention.h"

namespace lcplan::exec::impl {

// The CP rank holding segment `seg` of a sequence (load-balanced: rank r holds segments r and 2 cp - 1 - r).
inline int gdn_owner(int seg, int cp) { return seg < cp ? seg : 2 * cp - 1 - seg; }

struct GdnShape {
  int64_t C, P, kd, vd, S, hist;  // conv channels, in_proj columns, q/k width, v width, state floats, history floats
};
inline GdnShape gdn_shape(const Dims& d) {
  return {d.conv_channels(), d.in_proj_cols(), d.kdim(), d.vdim(), int64_t(d.lv) * d.dk * d.dv,
          int64_t(d.conv - 1) * d.conv_channels()};
}

inline linear_attention::Options la_opts() {
  linear_attention::Options o;
  o.chunk = 64;
  o.qk_l2norm = true;  // Qwen3.5 use_qk_l2norm_in_kernel
  return o;
}

// One sequence's segments in forward order (this rank's chunks), with the state and conv history handed along the
// CP ranks in sequence order: 0 -> 1 -> ... -> cp-1 (first chunks), cp-1 -> ... -> 0 (second chunks). That order is a
// pipeline every CP rank waits in (README "Context parallelism"); on NCCL each rank's receive comes before its send,
// so the chain completes on one stream.
template <class Ops>
void gdn_seq_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, int b, const float* proj, const float* gb,
                 float* conv_out, float* la_o, float* cp_state_out, const float* cp_state_in) {
  const Dims& d = c.d;
  const GdnShape gs = gdn_shape(d);
  const int64_t Sc = c.chunk_len, lv = d.lv, M = gs.S + gs.hist;
  WsOf<Ops> convw = o.widen(wd(w, u.off.conv), size_t(gs.C * d.conv));
  WsOf<Ops> carry = o.ws(size_t(M));
  for (int ch = 0; ch < c.chunks; ++ch) {
    const int seg = ch == 0 ? c.cp_rank : 2 * c.cp - 1 - c.cp_rank;
    const int64_t r0 = ch * Sc;  // the row pointers start at this sequence
    WsOf<Ops> msg = o.ws(size_t(M));  // state | history entering this segment
    bool has_prev = false;
    if (c.cp == 1) {
      has_prev = false;
    } else if (cp_state_in) {  // rebuild in backward: the saved state, no communication
      has_prev = seg > 0;
      o.copy(cp_state_in + (int64_t(b) * c.chunks + ch) * M, size_t(M), msg.data());
    } else if (seg > 0) {
      has_prev = true;
      if (gdn_owner(seg - 1, c.cp) == c.cp_rank) {
        o.copy(carry.data(), carry.size(), msg.data());
      } else {
        comm::recv(c.pg.cp, msg.data(), msg.size(), comm::DType::F32, gdn_owner(seg - 1, c.cp), 101);
      }
    }
    if (cp_state_out && c.cp > 1) o.copy(msg.data(), msg.size(), cp_state_out + (int64_t(b) * c.chunks + ch) * M);
    const float* state_in = has_prev ? msg.data() : nullptr;
    const float* hist_in = has_prev ? msg.data() + gs.S : nullptr;
    // causal conv1d + SiLU over q, k, v
    WsOf<Ops> xs = o.ws(size_t(Sc * gs.C)), ys = o.ws(size_t(Sc * gs.C));
    o.cols_out(proj, gs.P, r0, Sc, 0, gs.C, xs.data());
    const linear_attention::Conv cv{Sc, gs.C, d.conv, true};
    o.conv1d_fwd(cv, xs.data(), hist_in, convw.data(), ys.data());
    o.round(ys.data(), ys.size());
    o.cols_in(conv_out, gs.C, r0, Sc, 0, gs.C, ys.data());
    WsOf<Ops> next = o.ws(size_t(M));
    o.conv1d_history(cv, xs.data(), hist_in, next.data() + gs.S);
    // gated delta rule
    WsOf<Ops> q = o.ws(size_t(Sc * gs.kd)), k = o.ws(size_t(Sc * gs.kd)), v = o.ws(size_t(Sc * gs.vd));
    WsOf<Ops> g = o.ws(size_t(Sc * lv)), be = o.ws(size_t(Sc * lv));
    o.cols_out(ys.data(), gs.C, 0, Sc, 0, gs.kd, q.data());
    o.cols_out(ys.data(), gs.C, 0, Sc, gs.kd, gs.kd, k.data());
    o.cols_out(ys.data(), gs.C, 0, Sc, 2 * gs.kd, gs.vd, v.data());
    o.cols_out(gb, 2 * lv, r0, Sc, 0, lv, g.data());
    o.cols_out(gb, 2 * lv, r0, Sc, lv, lv, be.data());
    WsOf<Ops> out = o.ws(size_t(Sc * gs.vd));
    const linear_attention::Shape sh{Sc, d.lk, d.lv, d.dk, d.dv};
    o.la_fwd(sh, q.data(), k.data(), v.data(), g.data(), be.data(), state_in, out.data(), next.data(), la_opts());
    o.round(out.data(), out.size());
    o.cols_in(la_o, gs.vd, r0, Sc, 0, gs.vd, out.data());
    if (c.cp > 1 && !cp_state_in && seg < 2 * c.cp - 1) {
      if (gdn_owner(seg + 1, c.cp) == c.cp_rank) {
        o.copy(next.data(), next.size(), carry.data());
      } else {
        comm::send(c.pg.cp, next.data(), next.size(), comm::DType::F32, gdn_owner(seg + 1, c.cp), 101);
      }
    }
  }
}

// Gated DeltaNet mixer (HF Qwen3-Next / Qwen3.5): in_proj, conv1d + SiLU, the gated delta rule, gated RMSNorm,
// out_proj. `rebuild_state`: the CP states saved by the first forward, so a rebuild does not communicate.
template <class Ops>
void gdn_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* x, Keep keep,
             BasicLayerSaved<Ops::template Buf>& sv, const WsOf<Ops>* rebuild_state, float* y) {
  const Dims& d = c.d;
  const GdnShape gs = gdn_shape(d);
  const int64_t T = c.tokens, R = c.rows, H = d.H, lv = d.lv;
  WsOf<Ops> n1 = o.ws(size_t(R * H));
  o.rmsnorm(x, wd(w, u.off.norm1), n1.data(), R, H);
  o.round(n1.data(), n1.size());
  WsOf<Ops> proj = o.ws(size_t(T * gs.P));
  o.matmul(sp_gather(o, c, n1.data(), H).p, wd(w, u.off.w_in), proj.data(), T, H, gs.P);
  o.round(proj.data(), proj.size());
  // decay and beta in fp32 (ops_math.h gdn_decay, sigmoid)
  WsOf<Ops> gb = o.ws(size_t(T * 2 * lv));
  const int64_t bcol = 2 * gs.kd + 2 * gs.vd, acol = bcol + lv;
  o.gdn_gates(proj.data(), gs.P, acol, bcol, wd(w, u.off.a_log) + d.lv_first, wd(w, u.off.dt_bias) + d.lv_first, T, lv,
              gb.data());
  WsOf<Ops> conv = o.ws(size_t(T * gs.C)), la_o = o.ws(size_t(T * gs.vd));
  WsOf<Ops> cp_state;
  if (c.cp > 1 && !rebuild_state)
    cp_state = WsOf<Ops>(c.tr, Category::Activations, size_t(sequences(c) * c.chunks * (gs.S + gs.hist)));
  for_each_sequence(c, [&](int64_t at, int b, Ctx& s) {
    gdn_seq_fwd(o, s, u, w, b, proj.data() + at * gs.P, gb.data() + at * 2 * lv, conv.data() + at * gs.C,
                la_o.data() + at * gs.vd, cp_state.empty() ? nullptr : cp_state.data(),
                rebuild_state ? rebuild_state->data() : nullptr);
  });
  WsOf<Ops> z = o.ws(size_t(T * gs.vd)), gn = o.ws(size_t(T * gs.vd));
  o.cols_out(proj.data(), gs.P, 0, T, 2 * gs.kd + gs.vd, gs.vd, z.data());
  o.gated_norm(la_o.data(), z.data(), wd(w, u.off.gnorm), gn.data(), T, d.lv, d.dv);
  o.round(gn.data(), gn.size());
  o.row_parallel(c, gn.data(), wd(w, u.off.w_out), y, gs.vd, H);
  o.round(y, size_t(R * H));
  if (!cp_state.empty()) sv.cp_state = std::move(cp_state);
  if (keep == Keep::InputOnly) return;
  if (keep == Keep::All) sv.n1 = o.save16(n1.data(), n1.size());
  sv.proj = o.save16(proj.data(), proj.size());
  sv.conv = o.save16(conv.data(), conv.size());
  sv.gb = o.save32(gb.data(), gb.size());
  sv.la_o = o.save16(la_o.data(), la_o.size());
  sv.gn = o.save16(gn.data(), gn.size());
}

template <class Ops>
void gdn_seq_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, int b, const float* proj,
                 const float* conv, const float* gb, const float* cp_state, const float* dla_o, float* dproj,
                 const float* convw, float* dconvw) {
  const Dims& d = c.d;
  const GdnShape gs = gdn_shape(d);
  const int64_t Sc = c.chunk_len, lv = d.lv, M = gs.S + gs.hist;
  WsOf<Ops> carry = o.ws(size_t(M));
  bool have_carry = false;
  for (int ch = c.chunks - 1; ch >= 0; --ch) {
    const int seg = ch == 0 ? c.cp_rank : 2 * c.cp - 1 - c.cp_rank;
    const int64_t r0 = ch * Sc;  // the row pointers start at this sequence
    const bool has_prev = c.cp > 1 && seg > 0, has_next = c.cp > 1 && seg < 2 * c.cp - 1;
    WsOf<Ops> in = o.ws(size_t(M));  // dS | d_history arriving from the next segment
    if (has_next) {
      if (gdn_owner(seg + 1, c.cp) == c.cp_rank) {
        if (!have_carry) throw std::logic_error("gated DeltaNet CP backward: local carry missing");
        o.copy(carry.data(), carry.size(), in.data());
      } else {
        comm::recv(c.pg.cp, in.data(), in.size(), comm::DType::F32, gdn_owner(seg + 1, c.cp), 102);
      }
    }
    const float* saved = has_prev ? cp_state + (int64_t(b) * c.chunks + ch) * M : nullptr;
    const float* state_in = saved;
    const float* hist_in = saved ? saved + gs.S : nullptr;
    WsOf<Ops> ys = o.ws(size_t(Sc * gs.C));
    o.cols_out(conv, gs.C, r0, Sc, 0, gs.C, ys.data());
    WsOf<Ops> q = o.ws(size_t(Sc * gs.kd)), k = o.ws(size_t(Sc * gs.kd)), v = o.ws(size_t(Sc * gs.vd));
    WsOf<Ops> gg = o.ws(size_t(Sc * lv)), be = o.ws(size_t(Sc * lv)), dO = o.ws(size_t(Sc * gs.vd));
    o.cols_out(ys.data(), gs.C, 0, Sc, 0, gs.kd, q.data());
    o.cols_out(ys.data(), gs.C, 0, Sc, gs.kd, gs.kd, k.data());
    o.cols_out(ys.data(), gs.C, 0, Sc, 2 * gs.kd, gs.vd, v.data());
    o.cols_out(gb, 2 * lv, r0, Sc, 0, lv, gg.data());
    o.cols_out(gb, 2 * lv, r0, Sc, lv, lv, be.data());
    o.cols_out(dla_o, gs.vd, r0, Sc, 0, gs.vd, dO.data());
    WsOf<Ops> dq = o.ws(size_t(Sc * gs.kd)), dk = o.ws(size_t(Sc * gs.kd)), dv = o.ws(size_t(Sc * gs.vd));
    WsOf<Ops> dg = o.ws(size_t(Sc * lv)), dbe = o.ws(size_t(Sc * lv));
    WsOf<Ops> out = o.ws(size_t(M));  // dS | d_history for the previous segment
    const linear_attention::Shape sh{Sc, d.lk, d.lv, d.dk, d.dv};
    o.la_bwd(sh, q.data(), k.data(), v.data(), gg.data(), be.data(), state_in, dO.data(), has_next ? in.data() : nullptr,
             dq.data(), dk.data(), dv.data(), dg.data(), dbe.data(), has_prev ? out.data() : nullptr, la_opts());
    // conv1d + SiLU backward
    WsOf<Ops> dys = o.ws(size_t(Sc * gs.C)), xs = o.ws(size_t(Sc * gs.C)), dxs = o.ws(size_t(Sc * gs.C));
    o.cols_in(dys.data(), gs.C, 0, Sc, 0, gs.kd, dq.data());
    o.cols_in(dys.data(), gs.C, 0, Sc, gs.kd, gs.kd, dk.data());
    o.cols_in(dys.data(), gs.C, 0, Sc, 2 * gs.kd, gs.vd, dv.data());
    o.cols_out(proj, gs.P, r0, Sc, 0, gs.C, xs.data());
    WsOf<Ops> dcw = o.ws(size_t(gs.C * d.conv));
    const linear_attention::Conv cv{Sc, gs.C, d.conv, true};
    o.conv1d_bwd(cv, xs.data(), hist_in, convw, dys.data(), dxs.data(), has_prev ? out.data() + gs.S : nullptr,
                 dcw.data());
    o.accumulate(dcw.data(), dconvw, dcw.size());
    // The next segment's history is this segment's last conv - 1 input rows.
    if (has_next) o.accumulate(in.data() + gs.S, dxs.data() + (Sc - (d.conv - 1)) * gs.C, size_t(gs.hist));
    o.cols_in(dproj, gs.P, r0, Sc, 0, gs.C, dxs.data());
    // decay and beta backward into the a and b columns
    const int64_t bcol = 2 * gs.kd + 2 * gs.vd, acol = bcol + lv;
    o.gdn_gates_bwd(proj, gs.P, acol, bcol, wd(w, u.off.a_log) + d.lv_first, wd(w, u.off.dt_bias) + d.lv_first, gb,
                    dg.data(), dbe.data(), r0, Sc, lv, dproj, gd(g, u.off.dt_bias) + d.lv_first,
                    gd(g, u.off.a_log) + d.lv_first);
    if (has_prev) {
      if (gdn_owner(seg - 1, c.cp) == c.cp_rank) {
        o.copy(out.data(), out.size(), carry.data());
        have_carry = true;
      } else {
        comm::send(c.pg.cp, out.data(), out.size(), comm::DType::F32, gdn_owner(seg - 1, c.cp), 102);
      }
    }
  }
}

template <class Ops>
void gdn_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
             BasicLayerSaved<Ops::template Buf>& sv, const float* dy, float* dn1) {
  const Dims& d = c.d;
  const GdnShape gs = gdn_shape(d);
  const int64_t T = c.tokens, H = d.H;
  WsOf<Ops> gn = o.load(sv.gn);
  WsOf<Ops> dgn = o.ws(size_t(T * gs.vd));
  row_parallel_bwd(o, c, gn.data(), wd(w, u.off.w_out), dy, dgn.data(), gd(g, u.off.w_out), gs.vd, H);
  gn.reset();
  WsOf<Ops> proj = o.load(sv.proj), la_o = o.load(sv.la_o);
  WsOf<Ops> z = o.ws(size_t(T * gs.vd)), dz = o.ws(size_t(T * gs.vd)), dla = o.ws(size_t(T * gs.vd));
  o.cols_out(proj.data(), gs.P, 0, T, 2 * gs.kd + gs.vd, gs.vd, z.data());
  o.gated_norm_bwd(la_o.data(), z.data(), wd(w, u.off.gnorm), dgn.data(), dla.data(), dz.data(), gd(g, u.off.gnorm), T,
                   d.lv, d.dv);
  la_o.reset();
  dgn.reset();
  WsOf<Ops> dproj = o.ws(size_t(T * gs.P));
  o.cols_in(dproj.data(), gs.P, 0, T, 2 * gs.kd + gs.vd, gs.vd, dz.data());
  z.reset();
  dz.reset();
  WsOf<Ops> conv = o.load(sv.conv);
  WsOf<Ops> convw = o.widen(wd(w, u.off.conv), size_t(gs.C * d.conv));
  for_each_sequence(c, [&](int64_t at, int b, Ctx& s) {
    gdn_seq_bwd(o, s, u, w, g, b, proj.data() + at * gs.P, conv.data() + at * gs.C, sv.gb.data() + at * 2 * d.lv,
                sv.cp_state.empty() ? nullptr : sv.cp_state.data(), dla.data() + at * gs.vd, dproj.data() + at * gs.P,
                convw.data(), gd(g, u.off.conv));
  });
  conv.reset();
  dla.reset();
  proj.reset();
  WsOf<Ops> n1 = o.load(sv.n1);
  o.col_parallel_bwd(c, sp_gather(o, c, n1.data(), H).p, wd(w, u.off.w_in), dproj.data(), dn1, gd(g, u.off.w_in), H,
                     gs.P);
}

}  // namespace lcplan::exec::impl
