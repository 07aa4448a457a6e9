// Small ops of the executor's layers: GEMMs against bf16 weights, RMSNorm, gated RMSNorm, SwiGLU, bf16 rounding.
// Values that a bf16 training run would store (every op's output) are rounded to bf16 where they are produced, so a
// tensor rebuilt by recomputation equals the saved one bit for bit and every recompute mode computes the same step.
// The GPU versions are ops_cuda.h, on the same per-element math (ops_math.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "executor/tracking_allocator.h"
#include "kernels/common/bf16.h"

namespace lcplan::exec {


void round_bf16_inplace(float* x, size_t n);
void to_bf16(const float* x, bf16* y, size_t n);
void to_f32(const bf16* x, float* y, size_t n);
// An fp32 copy of n bf16 values in workspace (weights are widened per use, as a GPU GEMM reads bf16 tiles).
Buf<float> widen(Tracker& t, const bf16* x, size_t n);

// GEMMs accumulate in fp64 and round once to fp32: a layout that splits a GEMM's inner dimension over ranks (TP's
// row-parallel layers, whose fp64 partial sums are reduced in fp64) then computes the same fp32 value as one rank,
// instead of an fp32 rounding difference that bf16 storage would turn into ulp flips growing with depth.
// y[rows x n] = x[rows x k] * W[k x n]; W is bf16, the fp64 operands live in workspace for the call.
void matmul(Tracker& t, const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n);
// The same product unrounded (a row-parallel partial sum before its reduction over TP).
void matmul64(Tracker& t, const float* x, const bf16* W, double* y, int64_t rows, int64_t k, int64_t n);
// dx[rows x k] (= or +=) dy[rows x n] * W^T;  dW[k x n] += x^T * dy.
void matmul_bwd(Tracker& t, const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows,
                int64_t k, int64_t n, bool accumulate_dx = false);
// The same with dx unrounded (a column-parallel input gradient before its reduction over TP; may be null).
void matmul_bwd64(Tracker& t, const float* x, const bf16* W, const float* dy, double* dx, float* dW, int64_t rows,
                  int64_t k, int64_t n);

// RMSNorm over rows of width h: y = x / rms(x) * w (per-element math in ops_math.h, shared with ops_cuda.h).
void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h);
// dx (+=) and dw (+=) from x, w and dy.
void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                 bool accumulate_dx);

// Gated RMSNorm of each of `heads` value heads of width dv per row: y = o / rms(o) * w * silu(z)
// (HF Qwen3NextRMSNormGated; w has dv elements). Backward: dO and dz overwritten, dw +=.
void gated_norm(const float* o, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv);
void gated_norm_bwd(const float* o, const float* z, const bf16* w, const float* dy, float* dO, float* dz, float* dw,
                    int64_t rows, int64_t heads, int64_t dv);

// Gated DeltaNet gates of T rows (ops_math.h gdn_decay, sigmoid): from the in_proj output proj [T x P] (a at columns
// acol.., b at bcol.., lv heads each) and the heads' A_log and dt_bias (bf16, lv each), gb [T x 2 lv] = decay | beta.
void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
               int64_t T, int64_t lv, float* gb);
// Its backward over rows [r0, r0 + n) from dg, dbeta [n x lv]: dproj's a and b columns of those rows overwritten,
// d_dt_bias and d_a_log += (each head's rows summed in row order).
void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                   const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                   float* dproj, float* d_dt_bias, float* d_a_log);

// go[n] = bf16(o * sigmoid(gate)) (the attention output gate); backward: d_o, d_gate overwritten from dgo.
void output_gate(const float* o, const float* gate, float* go, size_t n);
void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n);

// A vocabulary shard's embedding rows [V0, V0 + Vl) of `table` (bf16 [Vl x h]) for T tokens into out (fp32 [T x h]):
// a token outside the shard gets a zero row (Megatron VocabParallelEmbedding). Backward: the rows of dy of in-shard
// tokens added into g (fp32 [Vl x h]) in token order.
void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl, float* out);
void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl, float* g);

// y[r, j] += b[j] over rows x n (a linear layer's bias, bf16); backward: db[j] += the column sums of dy, rows in order.
void add_bias(float* y, const bf16* b, int64_t rows, int64_t n);
void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db);

// act[rows x f] = silu(h1[:, :f]) * h1[:, f:]  (h1 rows are [gate | up], kernels/moe/moe_math.h)
void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f);
void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f);

}  // namespace lcplan::exec
