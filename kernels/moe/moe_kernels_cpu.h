// The MoE layer's CPU kernels: the references of moe_kernels_cuda.h, with the same arguments but the stream and fp32
// token rows throughout. The per-element math is moe_math.h's, and every loop keeps one fixed order, so a row's result
// does not depend on its chunk (the CPU layer's bit identity, moe_cpu.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/moe/moe_math.h"

namespace lcplan::moe::cpu {

// scores[T x E], idx[T x K], w[T x K] from logits[T x E] (bias may be null), token by token (route_token).
void route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
           float* w);
// dlogits[T x E] from dw[T x K] for the saved selection (route_token_bwd).
void route_bwd(const float* scores, const int* idx, const float* dw, const RouterParams& p, int tokens, float* dlogits);
// counts[c * experts + e] = slots of chunk c routed to expert e; chunk c holds tokens [bounds[c], bounds[c + 1]).
void chunk_counts(const int* idx, int top_k, int experts, const std::vector<int>& bounds, int* counts);
// Stable expert-major rows of n slots (moe_math.h expert_major_rows).
void expert_major_rows(const int* expert_of_slot, int n, int experts, int* row_of_slot);

// xp[row_of_slot[t*K+k]] = x[t] for every slot of `tokens` tokens.
void permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, float* xp);
// out[t] = sum_k w[t,k] * yp[row_of_slot[t*K+k]] (k in order) + gate[t] * shared[t]; w null: weights 1, shared null:
// no shared term, gate null: gate 1.
void unpermute(const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
               const float* shared, const float* gate, float* out);
// dyp[row(t,k)] = w[t,k] * dout[t]; dw[t,k] = <dout[t], yp[row(t,k)]>.
void unpermute_bwd(const float* dout, const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k,
                   int hidden, float* dyp, float* dw);

// act[r, j] = silu(h1[r, j]) * h1[r, F + j] for h1 [rows x 2F]; and its backward dh1 from dact [rows x F].
void swiglu(const float* h1, int64_t rows, int ffn, float* act);
void swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, float* dh1);
// out = a + b.
void add(const float* a, const float* b, int64_t n, float* out);

// Row blocks between the source-major and expert-major layouts: blocks[3*i..] = {source-major first row,
// expert-major first row, rows} (moe_layer.h BlockTable), rows `hidden` wide.
void copy_blocks(const float* in, float* out, const int64_t* blocks, int nblocks, int hidden, bool to_expert_major);

// Qwen's shared-expert gate: sgate[t] = sigmoid(<x[t], g>); backward: dso[t] = sgate[t] * dout[t] and
// dz[t] = <dout[t], sout[t]> * sgate (1 - sgate). sgate null (no gate): dso = dout, dz untouched.
void shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate);
void shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, float* dso,
                     float* dz);

}  // namespace lcplan::moe::cpu
