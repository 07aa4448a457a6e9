// Core attention under load-balanced context parallelism, once for both backends (common.h): the K/V exchange over
// the CP group, the attention kernel per local query chunk, RoPE per chunk. Full attention and MLA run it.
#pragma once

#include <cstdint>

#include "executor/layers/common.h"
#include "kernels/attention/attention.h"

namespace lcplan::exec::impl {

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

// Query-key pairs of causal queries at positions [a, b) (keys 0 .. position, at most `window` of them when > 0).
inline double causal_pairs(int64_t a, int64_t b, int64_t window) {
  auto upto = [&](int64_t n) {  // sum over positions p < n of min(p + 1, window)
    if (window <= 0 || n <= window) return double(n) * double(n + 1) / 2;
    return double(window) * double(window + 1) / 2 + double(n - window) * double(window);
  };
  return upto(b) - upto(a);
}

// One sequence: q [seq_local x hq x hd] -> o, lse [chunk][hq x chunk_len], against the whole sequence's K/V.
template <class Ops, class KV>
void attention_seq_fwd(Ops& o, Ctx& c, bool sliding, const float* q, const KV& kv, float* out, float* lse) {
  const int64_t qc = c.d.q_cols(), Sc = c.chunk_len;
  for (int ch = 0; ch < c.chunks; ++ch) {
    const attention::Options opt = attn_opts(c, sliding, ch);
    c.attention_pairs += causal_pairs(opt.q_start, opt.q_start + Sc, opt.window);
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
  for_each_sequence(c, [&](int64_t at, int, Ctx& s) {
    for (int ch = 0; ch < s.chunks; ++ch) {
      attention::RopeOptions ro;
      ro.rotary_dim = s.d.rotary;
      ro.theta = s.rope_theta;
      ro.start = s.chunk_start(ch);
      o.rope(s.chunk_len, heads, s.d.hd, x + (at + ch * s.chunk_len) * w, ro, backward);
    }
  });
}

// Core attention over every sequence of the microbatch: o and lse from q, k, v (lse [sequence][chunk][hq x len]).
template <class Ops>
void core_attention_fwd(Ops& o, Ctx& c, bool sliding, const float* q, const float* k, const float* v, float* out,
                        float* lse) {
  const int64_t qc = c.d.q_cols(), kvc = c.d.kv_cols();
  for_each_sequence(c, [&](int64_t at, int, Ctx& s) {
    const FullKV<Ops> kv = cp_gather_kv(o, s, k + at * kvc, v + at * kvc);
    attention_seq_fwd(o, s, sliding, q + at * qc, kv, out + at * qc, lse + at * s.d.hq);
  });
  o.round(out, size_t(c.tokens * qc));
}

// Its backward over every sequence: dq, dk, dv (this rank's rows) from the saved q, k, v, o, lse and dO.
template <class Ops>
void core_attention_bwd(Ops& o, Ctx& c, bool sliding, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dO, float* dq, float* dk, float* dv, int64_t kv_cols) {
  const int64_t qc = c.d.q_cols();
  for_each_sequence(c, [&](int64_t at, int, Ctx& s) {
    const FullKV<Ops> kv = cp_gather_kv(o, s, k + at * kv_cols, v + at * kv_cols);
    attention_seq_bwd(o, s, sliding, q + at * qc, kv, out + at * qc, lse + at * s.d.hq, dO + at * qc, dq + at * qc,
                      dk + at * kv_cols, dv + at * kv_cols);
  });
}

}  // namespace lcplan::exec::impl
