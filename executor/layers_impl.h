// The decoder layers' orchestration, once for both backends (executor/README.md "GPU backend"): which tensors are
// computed, saved, rebuilt, gathered and reduced, in which order, is this template's; what a step of it runs on is
// its `Ops` argument. HostOps (layer_ops_host.h) runs the CPU ops, kernels and MPI groups, and is what the paired and
// memory tests check; DeviceOps (layers_cuda.h) runs ops_cuda.h, the CUDA kernels and NCCL groups on one stream.
// So a device layer allocates, charges and communicates exactly what the tested host layer does.
//
// An Ops object `o` offers (pointers are the backend's: host or device memory; c is the layer's Ctx):
//   template <class T> using Buf;  Tracker& tr;
//   ws(n), save16(x, n), save32(x, n), load(bf16 buf), widen(bf16*, n)        workspace / activations / fp32 copies
//   round(x, n), to_bf16(x, y, n), copy(src, n, dst), accumulate(src, dst, n) (dst += src),
//   residual(a, b, out, n) (out = bf16(a + b)), cols_out(...), cols_in(...)    elementwise and column copies
//   matmul, matmul_bwd, row_parallel(c, ...), col_parallel_bwd(c, ...)        GEMMs (TP reductions inside the last two)
//   rmsnorm, rmsnorm_bwd, output_gate, output_gate_bwd, swiglu_fwd, swiglu_back, embedding_rows, embedding_rows_bwd,
//   embed_rows16(c, table, tokens, x) (whole-table rows, no TP)                the small ops of ops.h
//   rope(len, heads, hd, x, opts, backward), attention_fwd(c, shape, ...), attention_bwd(c, shape, ...)  core attention
//   cross_entropy(c, h, W, targets, gl, lse, dh, dW)                           the loss over the gathered tokens
//   gated_norm, gated_norm_bwd, gdn_gates, gdn_gates_bwd, conv1d_fwd, conv1d_history, conv1d_bwd, la_fwd, la_bwd
//                                                                              gated DeltaNet's ops and kernels
//   add_bias, bias_bwd                                                         q/k/v biases
//   moe_fwd, moe_bwd                                                           the MoE FFN (host: kernels/moe's
//                                                                              CPU layer; device: moe_cuda.cpp)
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "executor/layers.h"
#include "kernels/attention/attention.h"
#include "kernels/linear_attention/linear_attention.h"
#include "kernels/linear_ce/linear_ce.h"

namespace lcplan::exec::impl {

template <class Ops>
using WsOf = typename Ops::template Buf<float>;

inline const bf16* wd(const UnitView& w, size_t off) { return w.dense + off; }
inline float* gd(const UnitGrad& g, size_t off) { return g.dense + off; }

// A [tokens x w] tensor: this rank's rows all-gathered over TP, or (without TP) the rows themselves, not copied.
template <class Ops>
struct Rows {
  WsOf<Ops> buf;
  const float* p = nullptr;
};

// Sequence-parallel all-gather (Megatron gather_from_sequence_parallel_region): [rows x w] -> [tokens x w] in TP-rank
// order. The values are bf16-exact, so gathering fp32 moves the same numbers a bf16 all-gather would.
template <class Ops>
Rows<Ops> sp_gather(Ops& o, Ctx& c, const float* mine, int64_t w) {
  if (c.tp == 1) return {WsOf<Ops>(), mine};
  Rows<Ops> r{o.ws(size_t(c.tokens * w)), nullptr};
  comm::all_gather(c.pg.tp, mine, r.buf.data(), size_t(c.rows * w), comm::DType::F32);
  r.p = r.buf.data();
  return r;
}

// Row-parallel GEMM backward: dy [rows x n] all-gathered; dx [tokens x k] = dy W^T, dW += x^T dy.
template <class Ops>
void row_parallel_bwd(Ops& o, Ctx& c, const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                      int64_t n) {
  const Rows<Ops> d = sp_gather(o, c, dy, n);
  o.matmul_bwd(x, W, d.p, dx, dW, c.tokens, k, n);
}

// ---------------------------------------------------------------- full attention, context parallel

inline attention::Options attn_opts(const Ctx& c, bool sliding, int ch) {
  attention::Options opt;
  opt.causal = true;
  opt.window = sliding ? c.d.window : 0;
  opt.q_start = c.chunk_start(ch);
  opt.k_start = 0;
  return opt;
}

// Absolute position of CP rank `rank`'s local chunk `ch` (load-balanced causal CP: chunks rank and 2cp-1-rank).
inline int64_t cp_chunk_pos(const Ctx& c, int rank, int ch) {
  return int64_t(ch == 0 ? rank : 2 * c.cp - 1 - rank) * c.chunk_len;
}

// K and V of one whole sequence in positional order, fp32 [seq x kv_cols] each.
template <class Ops>
struct FullKV {
  WsOf<Ops> k, v;
};

// Context parallelism's K/V exchange, in the Ops primitives so both backends run the same code
// (tests/executor/cp_exchange_test.cpp holds it to plain reference loops). Gather: this rank's K and V rows packed
// [rows x (k | v)] in bf16 (the stored precision), all-gathered over CP and put back in sequence order.
template <class Ops>
FullKV<Ops> cp_gather_kv(Ops& o, Ctx& c, const float* k_loc, const float* v_loc) {
  const int64_t kvc = c.d.kv_cols(), L = c.seq_local, Sc = c.chunk_len;
  FullKV<Ops> kv{o.ws(size_t(c.seq * kvc)), o.ws(size_t(c.seq * kvc))};
  if (c.cp == 1) {
    o.copy(k_loc, size_t(L * kvc), kv.k.data());
    o.copy(v_loc, size_t(L * kvc), kv.v.data());
    return kv;
  }
  typename Ops::template Buf<bf16> mine(c.tr, Category::Workspace, size_t(L * 2 * kvc));
  {
    WsOf<Ops> packed = o.ws(size_t(L * 2 * kvc));
    o.cols_in(packed.data(), 2 * kvc, 0, L, 0, kvc, k_loc);
    o.cols_in(packed.data(), 2 * kvc, 0, L, kvc, kvc, v_loc);
    o.to_bf16(packed.data(), mine.data(), mine.size());
  }
  typename Ops::template Buf<bf16> all(c.tr, Category::Workspace, size_t(c.cp * L * 2 * kvc));
  comm::all_gather(c.pg.cp, mine.data(), all.data(), size_t(L * 2 * kvc), comm::DType::BF16);
  WsOf<Ops> allf = o.widen(all.data(), all.size());
  for (int j = 0; j < c.cp; ++j)
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t pos = cp_chunk_pos(c, j, ch), row = int64_t(j) * L + ch * Sc;
      o.cols_out(allf.data(), 2 * kvc, row, Sc, 0, kvc, kv.k.data() + pos * kvc);
      o.cols_out(allf.data(), 2 * kvc, row, Sc, kvc, kvc, kv.v.data() + pos * kvc);
    }
  return kv;
}

// Its backward: the whole sequence's dK/dV packed rank-major [rank][its two chunks][k | v] and reduce-scattered over
// CP (sum), this rank's rows into dk_loc, dv_loc.
template <class Ops>
void cp_scatter_dkv(Ops& o, Ctx& c, const float* dK, const float* dV, float* dk_loc, float* dv_loc) {
  const int64_t kvc = c.d.kv_cols(), L = c.seq_local, Sc = c.chunk_len;
  if (c.cp == 1) {
    o.copy(dK, size_t(L * kvc), dk_loc);
    o.copy(dV, size_t(L * kvc), dv_loc);
    return;
  }
  WsOf<Ops> packed = o.ws(size_t(c.cp * L * 2 * kvc)), mine = o.ws(size_t(L * 2 * kvc));
  for (int j = 0; j < c.cp; ++j)
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t pos = cp_chunk_pos(c, j, ch), row = int64_t(j) * L + ch * Sc;
      o.cols_in(packed.data(), 2 * kvc, row, Sc, 0, kvc, dK + pos * kvc);
      o.cols_in(packed.data(), 2 * kvc, row, Sc, kvc, kvc, dV + pos * kvc);
    }
  comm::reduce_scatter(c.pg.cp, packed.data(), mine.data(), size_t(L * 2 * kvc), comm::DType::F32,
                       comm::ReduceOp::Sum);
  o.cols_out(mine.data(), 2 * kvc, 0, L, 0, kvc, dk_loc);
  o.cols_out(mine.data(), 2 * kvc, 0, L, kvc, kvc, dv_loc);
}

// One sequence: q [seq_local x hq x hd] -> o, lse [chunk][hq x chunk_len], against the whole sequence's K/V.
template <class Ops, class KV>
void attention_seq_fwd(Ops& o, Ctx& c, bool sliding, const float* q, const KV& kv, float* out, float* lse) {
  const int64_t qc = c.d.q_cols(), Sc = c.chunk_len;
  for (int ch = 0; ch < c.chunks; ++ch) {
    const attention::Options opt = attn_opts(c, sliding, ch);
    const attention::Shape s{Sc, opt.q_start + Sc, c.d.hq, c.d.hkv, c.d.hd};
    o.attention_fwd(c, s, q + ch * Sc * qc, kv.k.data(), kv.v.data(), out + ch * Sc * qc, lse + ch * c.d.hq * Sc, opt);
  }
}

template <class Ops, class KV>
void attention_seq_bwd(Ops& o, Ctx& c, bool sliding, const float* q, const KV& kv, const float* out, const float* lse,
                       const float* d_o, float* dq, float* dk_loc, float* dv_loc) {
  const int64_t qc = c.d.q_cols(), kvc = c.d.kv_cols(), Sc = c.chunk_len;
  WsOf<Ops> dK = o.ws(size_t(c.seq * kvc)), dV = o.ws(size_t(c.seq * kvc));
  for (int ch = 0; ch < c.chunks; ++ch) {
    const attention::Options opt = attn_opts(c, sliding, ch);
    const attention::Shape s{Sc, opt.q_start + Sc, c.d.hq, c.d.hkv, c.d.hd};
    WsOf<Ops> tk = o.ws(size_t(s.sk * kvc)), tv = o.ws(size_t(s.sk * kvc));
    o.attention_bwd(c, s, q + ch * Sc * qc, kv.k.data(), kv.v.data(), out + ch * Sc * qc, lse + ch * c.d.hq * Sc,
                    d_o + ch * Sc * qc, dq + ch * Sc * qc, tk.data(), tv.data(), opt);
    o.accumulate(tk.data(), dK.data(), size_t(s.sk * kvc));
    o.accumulate(tv.data(), dV.data(), size_t(s.sk * kvc));
  }
  cp_scatter_dkv(o, c, dK.data(), dV.data(), dk_loc, dv_loc);
}

template <class Ops>
void rope_all(Ops& o, Ctx& c, float* x, int64_t heads, bool backward) {
  if (c.d.rotary == 0) return;
  const int64_t w = heads * c.d.hd;
  for (int b = 0; b < c.mb; ++b)
    for (int ch = 0; ch < c.chunks; ++ch) {
      attention::RopeOptions ro;
      ro.rotary_dim = c.d.rotary;
      ro.theta = c.rope_theta;
      ro.start = c.chunk_start(ch);
      o.rope(c.chunk_len, heads, c.d.hd, x + (int64_t(b) * c.seq_local + ch * c.chunk_len) * w, ro, backward);
    }
}

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

// Core attention over every sequence of the microbatch: o and lse from q, k, v.
template <class Ops>
void core_attention_fwd(Ops& o, Ctx& c, bool sliding, const float* q, const float* k, const float* v, float* out,
                        float* lse) {
  const int64_t qc = c.d.q_cols(), kvc = c.d.kv_cols(), L = c.seq_local;
  for (int b = 0; b < c.mb; ++b) {
    const FullKV<Ops> kv = cp_gather_kv(o, c, k + b * L * kvc, v + b * L * kvc);
    attention_seq_fwd(o, c, sliding, q + b * L * qc, kv, out + b * L * qc, lse + int64_t(b) * c.d.hq * L);
  }
  o.round(out, size_t(c.tokens * qc));
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
  const int64_t T = c.tokens, H = d.H, qc = d.q_cols(), kvc = d.kv_cols(), L = c.seq_local;
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
  for (int b = 0; b < c.mb; ++b) {
    const FullKV<Ops> kv = cp_gather_kv(o, c, k.data() + b * L * kvc, v.data() + b * L * kvc);
    attention_seq_bwd(o, c, l.sliding, q.data() + b * L * qc, kv, out.data() + b * L * qc,
                      sv.lse.data() + int64_t(b) * d.hq * L, dO.data() + b * L * qc, dq.data() + b * L * qc,
                      dk.data() + b * L * kvc, dv.data() + b * L * kvc);
  }
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

// ---------------------------------------------------------------- multi-head latent attention (DeepSeek-V3)

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
                L = c.seq_local, ql = d.mla_ql, kvl = d.mla_kvl, rope = d.mla_rope, nope = d.mla_nope, vd = d.mla_vd,
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
    for (int b = 0; b < c.mb; ++b) {
      const FullKV<Ops> kv = cp_gather_kv(o, c, k.data() + b * L * qc, vp.data() + b * L * qc);
      attention_seq_bwd(o, c, false, q.data() + b * L * qc, kv, out.data() + b * L * qc,
                        sv.lse.data() + int64_t(b) * hl * L, dO.data() + b * L * qc, dq.data() + b * L * qc,
                        dk.data() + b * L * qc, dvp.data() + b * L * qc);
    }
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

// ---------------------------------------------------------------- dense MLP

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

// ---------------------------------------------------------------- selective-recompute rebuild

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

// ---------------------------------------------------------------- gated DeltaNet, state passing over CP

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
    const int64_t r0 = int64_t(b) * c.seq_local + ch * Sc;
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
  if (c.cp > 1 && !rebuild_state) cp_state = WsOf<Ops>(c.tr, Category::Activations, size_t(c.mb * c.chunks * (gs.S + gs.hist)));
  for (int b = 0; b < c.mb; ++b)
    gdn_seq_fwd(o, c, u, w, b, proj.data(), gb.data(), conv.data(), la_o.data(),
                cp_state.empty() ? nullptr : cp_state.data(), rebuild_state ? rebuild_state->data() : nullptr);
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
    const int64_t r0 = int64_t(b) * c.seq_local + ch * Sc;
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
  for (int b = 0; b < c.mb; ++b)
    gdn_seq_bwd(o, c, u, w, g, b, proj.data(), conv.data(), sv.gb.data(),
                sv.cp_state.empty() ? nullptr : sv.cp_state.data(), dla.data(), dproj.data(), convw.data(),
                gd(g, u.off.conv));
  conv.reset();
  dla.reset();
  proj.reset();
  WsOf<Ops> n1 = o.load(sv.n1);
  o.col_parallel_bwd(c, sp_gather(o, c, n1.data(), H).p, wd(w, u.off.w_in), dproj.data(), dn1, gd(g, u.off.w_in), H,
                     gs.P);
}

// ---------------------------------------------------------------- one decoder layer

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
  else o.moe_fwd(c, u, w, n2, keep, sv, y);
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
  else o.moe_bwd(c, u, w, g, s, n2.data(), dout, dn2.data());
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

// ---------------------------------------------------------------- loss and embedding

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

template <class Ops>
void embedding_forward(Ops& o, Ctx& c, const bf16* table, const int64_t* tokens, bf16* x) {
  if (c.tp == 1) return o.embed_rows16(c, table, tokens, x);
  // Rows outside this rank's shard are zero; the reduce-scatter sums the one rank holding each row into its owner
  // (Megatron VocabParallelEmbedding + reduce_scatter_to_sequence_parallel_region): exact, one non-zero per element.
  const int64_t H = c.d.H, R = c.rows, T = c.tokens, V0 = c.d.V0, Vl = c.d.Vl;
  WsOf<Ops> all = o.ws(size_t(T * H)), mine = o.ws(size_t(R * H));
  o.embedding_rows(table, tokens, T, H, V0, Vl, all.data());
  comm::reduce_scatter(c.pg.tp, all.data(), mine.data(), size_t(R * H), comm::DType::F32, comm::ReduceOp::Sum);
  o.to_bf16(mine.data(), x, size_t(R * H));
}

template <class Ops>
void embedding_backward(Ops& o, Ctx& c, const int64_t* tokens, const float* dx, float* g) {
  const int64_t H = c.d.H, V0 = c.d.V0, Vl = c.d.Vl;
  const Rows<Ops> d = sp_gather(o, c, dx, H);
  o.embedding_rows_bwd(tokens, d.p, c.tokens, H, V0, Vl, g);
}

}  // namespace lcplan::exec::impl
