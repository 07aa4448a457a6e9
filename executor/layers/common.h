// The decoder layers' orchestration, once for both backends (executor/README.md "GPU backend"): which tensors are
// computed, saved, rebuilt, gathered and reduced, in which order, is these templates' (executor/layers/); what a step
// of it runs on is its `Ops` argument. HostOps (layer_ops_host.h) runs the CPU ops, kernels and MPI groups, and is what the paired and
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
//   moe_buf<T>(n), upload(v), save_counts(v), load_counts(buf), to_f32(x, y, n) and the members
//   kernels/moe/moe_pass.h lists                                               the MoE FFN (moe.h): host
//                                                                              kernels/moe/moe_ops_cpu.h, device
//                                                                              moe_ops_cuda.cpp
//
// This header holds what every layer kind uses (Rows, sp_gather, row_parallel_bwd); each kind has its own header
// beside it, and decoder_layer.h puts them together.
#pragma once

#include <cstdint>
#include <utility>

#include "executor/layers.h"
#include "kernels/moe/moe_pass.h"

namespace lcplan::exec::impl {

template <class Ops>
using WsOf = typename Ops::template Buf<float>;

inline const bf16* wd(const UnitView& w, size_t off) { return w.dense + off; }
inline float* gd(const UnitGrad& g, size_t off) { return g.dense + off; }

// The sequences of a microbatch, each as its first token row on this rank (in the TP-gathered token order), its index
// and a Ctx of that one sequence: mb sequences of seq_local tokens (f gets `c` itself), or a packed microbatch's
// segments (f gets a copy sized to the segment: positions restart, nothing attends or convolves across them, and under
// CP each segment is split in 2 cp chunks like a whole sequence, this rank holding its chunks r and 2 cp - 1 - r, as
// Megatron's THD layout with CP does).
template <class F>
void for_each_sequence(Ctx& c, F&& f) {
  if (c.segments.empty()) {
    for (int b = 0; b < c.mb; ++b) f(int64_t(b) * c.seq_local, b, c);
    return;
  }
  int64_t at = 0;
  for (size_t j = 0; j < c.segments.size(); ++j) {
    Ctx s = c;
    s.segments.clear();
    s.seq = c.segments[j];
    s.seq_local = s.tokens = s.seq / c.cp;
    s.chunk_len = s.seq_local / c.chunks;
    s.mb = 1;
    s.rows = s.seq_local / c.tp;
    s.attention_pairs = 0;
    f(at, int(j), s);
    c.attention_pairs += s.attention_pairs;
    at += s.seq_local;
  }
}

// Sequences in a microbatch: mb, or a packed microbatch's segments (what per-sequence saved state is sized by).
inline int sequences(const Ctx& c) { return c.segments.empty() ? c.mb : int(c.segments.size()); }

// A [tokens x w] tensor: this rank's rows all-gathered over TP, or (without TP) the rows themselves, not copied.
template <class Ops>
using Rows = moe::GatheredRows<Ops>;

// Sequence-parallel all-gather (Megatron gather_from_sequence_parallel_region): [rows x w] -> [tokens x w] in TP-rank
// order, the MoE shared expert's own (kernels/moe/moe_pass.h gather_rows). The values are bf16-exact, so gathering
// fp32 moves the same numbers a bf16 all-gather would.
template <class Ops>
Rows<Ops> sp_gather(Ops& o, Ctx& c, const float* mine, int64_t w) {
  return moe::gather_rows(o, c.pg.tp, mine, c.rows, w);
}

// Row-parallel GEMM backward: dy [rows x n] all-gathered; dx [tokens x k] = dy W^T, dW += x^T dy.
template <class Ops>
void row_parallel_bwd(Ops& o, Ctx& c, const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                      int64_t n) {
  const Rows<Ops> d = sp_gather(o, c, dy, n);
  o.matmul_bwd(x, W, d.p, dx, dW, c.tokens, k, n);
}

}  // namespace lcplan::exec::impl
