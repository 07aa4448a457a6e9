// CUDA pieces of the MoE layer (DeepEP style: raw device pointers, explicit sizes, the stream last; every call
// checked). The math is moe_math.h, the same code the CPU layer runs. Token buffers are templated on the element
// type T (float or __nv_bfloat16); routing, GEMM accumulation, h1 and gradients of weights stay fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/moe/moe_math.h"
#include "parallel/chunk_schedule.h"  // kMaxChunks: one limit for plans, schedule and kernels

namespace lcplan::moe::gpu {

using bf16 = __nv_bfloat16;

// One thread per token: scores[T x E], idx[T x K], w[T x K] from logits[T x E] (bias may be null).
void launch_route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
                  float* w, cudaStream_t stream);
// One thread per token: dlogits[T x E] from dw[T x K] for the saved selection (route_token_bwd).
void launch_route_bwd(const float* scores, const int* idx, const float* dw, const RouterParams& p, int tokens,
                      float* dlogits, cudaStream_t stream);

// counts[c * experts + e] = slots of chunk c routed to expert e; chunk c holds tokens [bounds[c], bounds[c+1]).
struct ChunkBounds {
  int b[kMaxChunks + 1] = {};
  int chunks = 1;
};
void launch_chunk_counts(const int* idx, int tokens, int top_k, int experts, ChunkBounds bounds, int* counts,
                         cudaStream_t stream);

// Stable expert-major rows of n slots, in parallel: per-tile counts -> exclusive scan (CUB) -> per-tile scatter
// (tile_expert_counts / tile_scatter_rows in moe_math.h). offsets[E+1], row_of_slot[n]. `workspace` holds
// expert_major_rows_workspace(n, experts) bytes (query it first; the query itself launches nothing).
constexpr int kPermuteTile = 128;
size_t expert_major_rows_workspace(int n, int experts);
void launch_expert_major_rows(const int* expert_of_slot, int n, int experts, int* offsets, int* row_of_slot,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

// xp[row_of_slot[t*K+k]] = T(x[t]) for every slot of `tokens` tokens.
template <class T>
void launch_permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, T* xp,
                    cudaStream_t stream);
// out[t] = sum_k w[t,k] * yp[row_of_slot[t*K+k]] (k in order, as on the CPU) + gate[t] * shared[t].
// w null: weights 1 (the permute backward); shared null: no shared term; gate null: gate 1.
template <class T>
void launch_unpermute(const T* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
                      const float* shared, const float* gate, float* out, cudaStream_t stream);
// dyp[row(t,k)] = T(w[t,k] * dout[t]); dw[t,k] = <dout[t], yp[row(t,k)]> (fp32).
template <class T>
void launch_unpermute_bwd(const float* dout, const T* yp, const int* row_of_slot, const float* w, int tokens,
                          int top_k, int hidden, T* dyp, float* dw, cudaStream_t stream);

// act[r, j] = T(silu(h1[r, j]) * h1[r, F + j]); h1 is fp32 [rows x 2F].
template <class T>
void launch_swiglu(const float* h1, int64_t rows, int ffn, T* act, cudaStream_t stream);
// dh1 = T(swiglu_bwd(h1, dact)); dact fp32 [rows x F].
template <class T>
void launch_swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, T* dh1, cudaStream_t stream);
template <class T>
void launch_cast(const float* in, int64_t n, T* out, cudaStream_t stream);
// out = a + b (fp32).
void launch_add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream);

// Row blocks between the source-major (as received) and expert-major (as the grouped GEMM wants) layouts:
// blocks[3*i..] = {source-major first row, expert-major first row, rows} (device array); `to_expert_major`
// picks the direction. Rows are `hidden` elements wide; max_rows (the largest block, host-known) sizes the grid.
template <class T>
void launch_copy_blocks(const T* in, T* out, const int64_t* blocks, int nblocks, int64_t max_rows, int hidden,
                        bool to_expert_major, cudaStream_t stream);

// Qwen's shared-expert gate: sgate[t] = sigmoid(<x[t], g>); backward: dso[t] = T(sgate[t] * dout[t]) and
// dz[t] = <dout[t], sout[t]> * sgate (1 - sgate). sgate null (no gate): dso = T(dout), dz untouched.
void launch_shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate, cudaStream_t stream);
template <class T>
void launch_shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, T* dso,
                            float* dz, cudaStream_t stream);

// Row-major C[m x n] = alpha * op(A) op(B) + beta * C through cublasGemmEx with fp32 accumulation. A is m x k
// (k x m when trans_a), B is k x n (n x k when trans_b). ab / c: CUDA_R_32F or CUDA_R_16BF. pedantic forbids
// TF32 (routing must pick the same experts as the fp32 CPU reference). m, n or k = 0 launches nothing.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A,
          const void* B, void* C, cudaDataType_t ab, cudaDataType_t c, float alpha, float beta, bool pedantic,
          cudaStream_t stream);
// Grouped GEMM over experts, one gemm per group that has rows: group g owns rows [row_offsets[g], row_offsets[g+1])
// (host array) of A and C, and C_g[rows x n] = A_g[rows x k] * op(B_g), B_g = B + g * k * n elements (k x n, or
// n x k when trans_b); row-major, fp32 accumulation, types as gemm. Groups with no rows launch nothing.
void grouped_gemm(cublasHandle_t handle, bool trans_b, const void* A, const void* B, void* C,
                  const int64_t* row_offsets, int groups, int64_t k, int64_t n, cudaDataType_t ab, cudaDataType_t c,
                  cudaStream_t stream);

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (sizeof(T) == 2) return CUDA_R_16BF;
  else return CUDA_R_32F;
}

}  // namespace lcplan::moe::gpu
