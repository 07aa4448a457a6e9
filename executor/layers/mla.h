// The multi-head latent attention mixer (DeepSeek-V3, Kimi-K2, Moonlight), forward and backward over an Ops
// (common.h); its core attention is core_attention.h's.
#pragma once

#include <cstdint>

#include "executor/layers/core_attention.h"

namespace lcplan::exec::impl {

// MLA (DeepSeek-V3 report, arXiv 2412.19437, section 2.1.1) as Megatron-LM runs it with sequence parallelism
// (megatron/core/transformer/multi_latent_attention.py): the down-projections (duplicated over TP) and their RMSNorms
// on this rank's rows, the up-projections column-parallel on the gathered tokens, the rope key shared by every head.
// The core attention is the full-attention path's (CP included) with hq = hkv = heads, head dim nope + rope and v
// zero-padded to it: the padding's output columns are zero and its gradients unused (Dims "multi-head latent").

template <class Ops>
struct MlaProj {
  WsOf<Ops> qa, qn, kva, kvn;  // rows: q_a output and its norm, kv_a output [kv_lora | rope key] and its norm
  WsOf<Ops> q, k, v;           // every local token: q, k [heads x (rope | nope)] after RoPE, v [heads x vd]
};

// `n` columns from column c0 of a [T x a_cols] tensor into column d0 of a [T x b_cols] one.
template <class Ops>
void copy_cols(Ops& o, int64_t T, const float* a, int64_t a_cols, int64_t c0, float* b, int64_t b_cols, int64_t d0,
               int64_t n) {
  WsOf<Ops> t = o.ws(size_t(T * n));
  o.cols_out(a, a_cols, 0, T, c0, n, t.data());
  o.cols_in(b, b_cols, 0, T, d0, n, t.data());
}

// v [T x heads x vd] zero-padded to the core attention's head dim [T x heads x hd], or the reverse (the first vd dims).
template <class Ops>
WsOf<Ops> mla_pad_v(Ops& o, Ctx& c, const float* v) {
  const Dims& d = c.d;
  WsOf<Ops> p = o.ws(size_t(c.tokens * d.q_cols()));
  for (int64_t h = 0; h < d.hq; ++h)
    copy_cols(o, c.tokens, v, d.mla_v_cols(), h * d.mla_vd, p.data(), d.q_cols(), h * d.hd, d.mla_vd);
  return p;
}
template <class Ops>
void mla_unpad_v(Ops& o, Ctx& c, const float* padded, float* v) {
  const Dims& d = c.d;
  for (int64_t h = 0; h < d.hq; ++h)
    copy_cols(o, c.tokens, padded, d.q_cols(), h * d.hd, v, d.mla_v_cols(), h * d.mla_vd, d.mla_vd);
}

template <class Ops>
MlaProj<Ops> mla_project(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* n1) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, R = c.rows, H = d.H, hl = d.hq, qk = d.hd, ql = d.mla_ql, kvl = d.mla_kvl,
                rope = d.mla_rope, nope = d.mla_nope, vd = d.mla_vd, kva = kvl + rope, kvb = d.mla_kvb_cols();
  MlaProj<Ops> p;
  p.q = o.ws(size_t(T * hl * qk));
  if (ql > 0) {
    p.qa = o.ws(size_t(R * ql));
    o.matmul(n1, wd(w, u.off.mla_qa), p.qa.data(), R, H, ql);
    o.round(p.qa.data(), p.qa.size());
    p.qn = o.ws(size_t(R * ql));
    o.rmsnorm(p.qa.data(), wd(w, u.off.mla_qa_norm), p.qn.data(), R, ql);
    o.round(p.qn.data(), p.qn.size());
    o.matmul(sp_gather(o, c, p.qn.data(), ql).p, wd(w, u.off.mla_q), p.q.data(), T, ql, hl * qk);
  } else {
    o.matmul(sp_gather(o, c, n1, H).p, wd(w, u.off.mla_q), p.q.data(), T, H, hl * qk);
  }
  o.round(p.q.data(), p.q.size());
  p.kva = o.ws(size_t(R * kva));
  o.matmul(n1, wd(w, u.off.mla_kva), p.kva.data(), R, H, kva);
  o.round(p.kva.data(), p.kva.size());
  p.kvn = o.ws(size_t(R * kvl));
  {
    WsOf<Ops> ckv = o.ws(size_t(R * kvl));
    o.cols_out(p.kva.data(), kva, 0, R, 0, kvl, ckv.data());
    o.rmsnorm(ckv.data(), wd(w, u.off.mla_kv_norm), p.kvn.data(), R, kvl);
    o.round(p.kvn.data(), p.kvn.size());
  }
  WsOf<Ops> up = o.ws(size_t(T * kvb));
  o.matmul(sp_gather(o, c, p.kvn.data(), kvl).p, wd(w, u.off.mla_kvb), up.data(), T, kvl, kvb);
  o.round(up.data(), up.size());
  WsOf<Ops> kr_rows = o.ws(size_t(R * rope));
  o.cols_out(p.kva.data(), kva, 0, R, kvl, rope, kr_rows.data());
  const Rows<Ops> kr = sp_gather(o, c, kr_rows.data(), rope);
  p.k = o.ws(size_t(T * hl * qk));
  p.v = o.ws(size_t(T * hl * vd));
  for (int64_t h = 0; h < hl; ++h) {
    o.cols_in(p.k.data(), hl * qk, 0, T, h * qk, rope, kr.p);  // the shared rope key, before RoPE
    copy_cols(o, T, up.data(), kvb, h * (nope + vd), p.k.data(), hl * qk, h * qk + rope, nope);
    copy_cols(o, T, up.data(), kvb, h * (nope + vd) + nope, p.v.data(), hl * vd, h * vd, vd);
  }
  rope_all(o, c, p.q.data(), hl, false);
  rope_all(o, c, p.k.data(), hl, false);
  o.round(p.q.data(), p.q.size());
  o.round(p.k.data(), p.k.size());
  return p;
}

template <class Ops>
void mla_fwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const float* x, Keep keep,
             BasicLayerSaved<Ops::template Buf>& sv, float* y) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, R = c.rows, H = d.H, vc = d.mla_v_cols();
  WsOf<Ops> n1 = o.ws(size_t(R * H));
  o.rmsnorm(x, wd(w, u.off.norm1), n1.data(), R, H);
  o.round(n1.data(), n1.size());
  MlaProj<Ops> p = mla_project(o, c, u, w, n1.data());
  WsOf<Ops> out = o.ws(size_t(T * d.q_cols()));
  WsOf<Ops> lse(c.tr, keep == Keep::All ? Category::Activations : Category::Workspace, size_t(T * d.hq));
  {
    WsOf<Ops> vp = mla_pad_v(o, c, p.v.data());
    core_attention_fwd(o, c, false, p.q.data(), p.k.data(), vp.data(), out.data(), lse.data());
  }
  WsOf<Ops> ov = o.ws(size_t(T * vc));
  mla_unpad_v(o, c, out.data(), ov.data());
  out.reset();
  o.row_parallel(c, ov.data(), wd(w, u.off.wo), y, vc, H);
  o.round(y, size_t(R * H));
  if (keep == Keep::InputOnly) return;
  if (keep == Keep::All) {
    sv.n1 = o.save16(n1.data(), n1.size());
    sv.lse = std::move(lse);
  }
  if (d.mla_ql > 0) {
    sv.mla_qa = o.save16(p.qa.data(), p.qa.size());
    sv.mla_qn = o.save16(p.qn.data(), p.qn.size());
  }
  sv.mla_kva = o.save16(p.kva.data(), p.kva.size());
  sv.mla_kvn = o.save16(p.kvn.data(), p.kvn.size());
  sv.q = o.save16(p.q.data(), p.q.size());
  sv.k = o.save16(p.k.data(), p.k.size());
  sv.v = o.save16(p.v.data(), p.v.size());
  sv.o = o.save16(ov.data(), ov.size());
}

// dy: gradient of the mixer output; writes dn1 (gradient of the pre-mixer norm output, this rank's rows).
template <class Ops>
void mla_bwd(Ops& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
             BasicLayerSaved<Ops::template Buf>& sv, const float* dy, float* dn1) {
  const Dims& d = c.d;
  const int64_t T = c.tokens, R = c.rows, H = d.H, hl = d.hq, qk = d.hd, qc = d.q_cols(), vc = d.mla_v_cols(),
                ql = d.mla_ql, kvl = d.mla_kvl, rope = d.mla_rope, nope = d.mla_nope, vd = d.mla_vd,
                kva = kvl + rope, kvb = d.mla_kvb_cols();
  // o_proj, then the core attention on the padded head dim.
  WsOf<Ops> dq = o.ws(size_t(T * qc)), dk = o.ws(size_t(T * qc)), dvp = o.ws(size_t(T * qc));
  {
    WsOf<Ops> ov = o.load(sv.o), dov = o.ws(size_t(T * vc));
    row_parallel_bwd(o, c, ov.data(), wd(w, u.off.wo), dy, dov.data(), gd(g, u.off.wo), vc, H);
    WsOf<Ops> out = mla_pad_v(o, c, ov.data()), dO = mla_pad_v(o, c, dov.data());
    ov.reset();
    dov.reset();
    WsOf<Ops> q = o.load(sv.q), k = o.load(sv.k), v = o.load(sv.v);
    WsOf<Ops> vp = mla_pad_v(o, c, v.data());
    v.reset();
    core_attention_bwd(o, c, false, q.data(), k.data(), vp.data(), out.data(), sv.lse.data(), dO.data(), dq.data(),
                       dk.data(), dvp.data(), qc);
  }
  rope_all(o, c, dq.data(), hl, true);
  rope_all(o, c, dk.data(), hl, true);
  // kv_b: [k_nope | v] per head from dk and dv; the rope key's gradient summed over the heads, then over TP.
  WsOf<Ops> dup = o.ws(size_t(T * kvb)), dkr_all = o.ws(size_t(T * rope));
  for (int64_t h = 0; h < hl; ++h) {
    copy_cols(o, T, dk.data(), qc, h * qk + rope, dup.data(), kvb, h * (nope + vd), nope);
    copy_cols(o, T, dvp.data(), qc, h * qk, dup.data(), kvb, h * (nope + vd) + nope, vd);
    WsOf<Ops> t = o.ws(size_t(T * rope));
    o.cols_out(dk.data(), qc, 0, T, h * qk, rope, t.data());
    o.accumulate(t.data(), dkr_all.data(), size_t(T * rope));
  }
  dk.reset();
  dvp.reset();
  WsOf<Ops> dkva = o.ws(size_t(R * kva));
  {
    WsOf<Ops> kvn = o.load(sv.mla_kvn), dkvn = o.ws(size_t(R * kvl));
    o.col_parallel_bwd(c, sp_gather(o, c, kvn.data(), kvl).p, wd(w, u.off.mla_kvb), dup.data(), dkvn.data(),
                       gd(g, u.off.mla_kvb), kvl, kvb);
    WsOf<Ops> kv_a = o.load(sv.mla_kva), ckv = o.ws(size_t(R * kvl)), dckv = o.ws(size_t(R * kvl));
    o.cols_out(kv_a.data(), kva, 0, R, 0, kvl, ckv.data());
    o.rmsnorm_bwd(ckv.data(), wd(w, u.off.mla_kv_norm), dkvn.data(), dckv.data(), gd(g, u.off.mla_kv_norm), R, kvl,
                  false);
    o.cols_in(dkva.data(), kva, 0, R, 0, kvl, dckv.data());
    WsOf<Ops> dkr = o.ws(size_t(R * rope));
    if (c.tp == 1) o.copy(dkr_all.data(), size_t(R * rope), dkr.data());
    else
      comm::reduce_scatter(c.pg.tp, dkr_all.data(), dkr.data(), size_t(R * rope), comm::DType::F32,
                           comm::ReduceOp::Sum);
    o.cols_in(dkva.data(), kva, 0, R, kvl, rope, dkr.data());
  }
  dup.reset();
  dkr_all.reset();
  // The down-projections on this rank's rows (their weights' gradients are partial sums over TP, as the norms').
  WsOf<Ops> n1 = o.load(sv.n1);
  o.matmul_bwd(n1.data(), wd(w, u.off.mla_kva), dkva.data(), dn1, gd(g, u.off.mla_kva), R, H, kva);
  WsOf<Ops> dn1q = o.ws(size_t(R * H));
  if (ql > 0) {
    WsOf<Ops> qn = o.load(sv.mla_qn), dqn = o.ws(size_t(R * ql));
    o.col_parallel_bwd(c, sp_gather(o, c, qn.data(), ql).p, wd(w, u.off.mla_q), dq.data(), dqn.data(),
                       gd(g, u.off.mla_q), ql, qc);
    WsOf<Ops> qa = o.load(sv.mla_qa), dqa = o.ws(size_t(R * ql));
    o.rmsnorm_bwd(qa.data(), wd(w, u.off.mla_qa_norm), dqn.data(), dqa.data(), gd(g, u.off.mla_qa_norm), R, ql, false);
    o.matmul_bwd(n1.data(), wd(w, u.off.mla_qa), dqa.data(), dn1q.data(), gd(g, u.off.mla_qa), R, H, ql);
  } else {
    o.col_parallel_bwd(c, sp_gather(o, c, n1.data(), H).p, wd(w, u.off.mla_q), dq.data(), dn1q.data(),
                       gd(g, u.off.mla_q), H, qc);
  }
  o.accumulate(dn1q.data(), dn1, size_t(R * H));
}

}  // namespace lcplan::exec::impl
