// The full-attention mixer (GQA, partial RoPE, Qwen3.5's output gate, q/k RMSNorm, q/k/v biases, sliding windows):
// projections, core attention (core_attention.h), o_proj; forward and backward over an Ops (common.h).
#pragma once

#include <cstdint>
#include <utility>

#include "executor/layers/core_attention.h"

namespace lcplan::exec::impl {

template <class Ops>
struct QKV {
  WsOf<Ops> q, gate, k, v;
};

// Projections, qk-norm and RoPE from the pre-mixer norm output (values rounded to bf16 as stored).
template <class Ops>
QKV<Ops> project_qkv(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* n1, WsOf<Ops>* raw_out) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, qc = d.q_cols(), kvc = d.kv_cols(), P = d.qkv_cols();
  WsOf<Ops> P_ = o.ws(size_t(T * P));
  o.matmul(n1, wd(w, u.off.w_qkv), P_.data(), T, d.H, P);
  if (d.qkv_bias) o.add_bias(P_.data(), wd(w, u.off.b_qkv), T, P);
  o.round(P_.data(), P_.size());
  QKV<Ops> r{o.ws(size_t(T * qc)), o.ws(d.gate ? size_t(T * qc) : 0), o.ws(size_t(T * kvc)), o.ws(size_t(T * kvc))};
  int64_t col = 0;
  o.cols_out(P_.data(), P, 0, T, col, qc, r.q.data());
  col += qc;
  if (d.gate) {
    o.cols_out(P_.data(), P, 0, T, col, qc, r.gate.data());
    col += qc;
  }
  o.cols_out(P_.data(), P, 0, T, col, kvc, r.k.data());
  col += kvc;
  o.cols_out(P_.data(), P, 0, T, col, kvc, r.v.data());
  if (d.qk_norm) {
    o.rmsnorm(r.q.data(), wd(w, u.off.q_norm), r.q.data(), T * d.hq, d.hd);
    o.rmsnorm(r.k.data(), wd(w, u.off.k_norm), r.k.data(), T * d.hkv, d.hd);
    o.round(r.q.data(), r.q.size());
    o.round(r.k.data(), r.k.size());
  }
  rope_all(o, c, r.q.data(), d.hq, false);
  rope_all(o, c, r.k.data(), d.hkv, false);
  o.round(r.q.data(), r.q.size());
  o.round(r.k.data(), r.k.size());
  if (raw_out) *raw_out = std::move(P_);
  return r;
}

// Returns the mixer output y [rows x H] (fp32, bf16 values).
template <class Ops>
void attention_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, const float* x,
                   Keep keep, BasicLayerSaved<Ops::template Buf>& sv, float* y) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, R = c.rows, H = d.H, qc = d.q_cols();
  WsOf<Ops> n1 = o.ws(size_t(R * H));
  o.rmsnorm(x, wd(w, u.off.norm1), n1.data(), R, H);
  o.round(n1.data(), n1.size());
  QKV<Ops> r = project_qkv(o, c, u, w, sp_gather(o, c, n1.data(), H).p, nullptr);
  WsOf<Ops> out = o.ws(size_t(T * qc));
  WsOf<Ops> lse(c.tr, keep == Keep::All ? Category::Activations : Category::Workspace, size_t(T * d.hq));
  core_attention_fwd(o, c, l.sliding, r.q.data(), r.k.data(), r.v.data(), out.data(), lse.data());
  WsOf<Ops> go;
  const float* oproj_in = out.data();
  if (d.gate) {
    go = o.ws(size_t(T * qc));
    o.output_gate(out.data(), r.gate.data(), go.data(), size_t(T * qc));
    oproj_in = go.data();
  }
  o.row_parallel(c, oproj_in, wd(w, u.off.wo), y, qc, H);
  o.round(y, size_t(R * H));
  if (keep == Keep::InputOnly) return;
  if (keep == Keep::All) {
    sv.n1 = o.save16(n1.data(), n1.size());
    sv.lse = std::move(lse);
  }
  sv.q = o.save16(r.q.data(), r.q.size());
  sv.k = o.save16(r.k.data(), r.k.size());
  sv.v = o.save16(r.v.data(), r.v.size());
  sv.o = o.save16(out.data(), out.size());
  if (d.gate) {
    sv.gate = o.save16(r.gate.data(), r.gate.size());
    sv.go = o.save16(go.data(), go.size());
  }
}

// dy: gradient of the mixer output; writes dn1 (gradient of the pre-mixer norm output).
template <class Ops>
void attention_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g, const LayerSpec& l,
                   BasicLayerSaved<Ops::template Buf>& sv, const float* dy, float* dn1) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, H = d.H, qc = d.q_cols(), kvc = d.kv_cols();
  WsOf<Ops> out = o.load(sv.o);
  WsOf<Ops> gate, go;
  if (d.gate) {
    gate = o.load(sv.gate);
    go = o.load(sv.go);
  }
  WsOf<Ops> dgo = o.ws(size_t(T * qc));
  row_parallel_bwd(o, c, d.gate ? go.data() : out.data(), wd(w, u.off.wo), dy, dgo.data(), gd(g, u.off.wo), qc, H);
  WsOf<Ops> dO = o.ws(size_t(T * qc)), dgate = o.ws(d.gate ? size_t(T * qc) : 0);
  if (d.gate) o.output_gate_bwd(dgo.data(), out.data(), gate.data(), dO.data(), dgate.data(), size_t(T * qc));
  else o.copy(dgo.data(), size_t(T * qc), dO.data());
  go.reset();
  dgo.reset();
  WsOf<Ops> q = o.load(sv.q), k = o.load(sv.k), v = o.load(sv.v);
  WsOf<Ops> dq = o.ws(size_t(T * qc)), dk = o.ws(size_t(T * kvc)), dv = o.ws(size_t(T * kvc));
  core_attention_bwd(o, c, l.sliding, q.data(), k.data(), v.data(), out.data(), sv.lse.data(), dO.data(), dq.data(),
                     dk.data(), dv.data(), kvc);
  q.reset();
  k.reset();
  v.reset();
  out.reset();
  dO.reset();
  rope_all(o, c, dq.data(), d.hq, true);
  rope_all(o, c, dk.data(), d.hkv, true);
  WsOf<Ops> n1_mine = o.load(sv.n1);
  const Rows<Ops> n1 = sp_gather(o, c, n1_mine.data(), H);  // the saved rows, re-gathered (sequence parallelism)
  if (d.qk_norm) {
    // The norms' inputs are the raw projections: recomputed from n1 (one GEMM) rather than kept.
    WsOf<Ops> raw;
    QKV<Ops> pre = project_qkv(o, c, u, w, n1.p, &raw);
    const int64_t P = d.qkv_cols();
    WsOf<Ops> qr = o.ws(size_t(T * qc)), kr = o.ws(size_t(T * kvc));
    o.cols_out(raw.data(), P, 0, T, 0, qc, qr.data());
    o.cols_out(raw.data(), P, 0, T, qc * (d.gate ? 2 : 1), kvc, kr.data());
    o.rmsnorm_bwd(qr.data(), wd(w, u.off.q_norm), dq.data(), dq.data(), gd(g, u.off.q_norm), T * d.hq, d.hd, false);
    o.rmsnorm_bwd(kr.data(), wd(w, u.off.k_norm), dk.data(), dk.data(), gd(g, u.off.k_norm), T * d.hkv, d.hd,
                  false);
  }
  const int64_t P = d.qkv_cols();
  WsOf<Ops> dP = o.ws(size_t(T * P));
  int64_t col = 0;
  o.cols_in(dP.data(), P, 0, T, col, qc, dq.data());
  col += qc;
  if (d.gate) {
    o.cols_in(dP.data(), P, 0, T, col, qc, dgate.data());
    col += qc;
  }
  o.cols_in(dP.data(), P, 0, T, col, kvc, dk.data());
  col += kvc;
  o.cols_in(dP.data(), P, 0, T, col, kvc, dv.data());
  o.col_parallel_bwd(c, n1.p, wd(w, u.off.w_qkv), dP.data(), dn1, gd(g, u.off.w_qkv), H, P);
  if (d.qkv_bias) o.bias_bwd(dP.data(), T, P, gd(g, u.off.b_qkv));
}

}  // namespace lcplan::exec::impl
