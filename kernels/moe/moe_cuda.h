// CUDA pieces of the MoE layer (DeepEP style: raw pointers, explicit sizes, the stream last; every call checked).
// The math is moe_math.h, the same code the CPU layer runs. fp32 for now, matching the CPU reference.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/moe/moe_math.h"

namespace lcplan::moe::gpu {

// One thread per token: scores[T x E], idx[T x K], w[T x K] from logits[T x E] (bias may be null).
void launch_route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
                  float* w, cudaStream_t stream);
// Stable expert-major rows of n slots (a single thread: correct by construction, not fast).
void launch_expert_major_rows(const int* expert_of_slot, int n, int experts, int* offsets, int* row_of_slot,
                              cudaStream_t stream);
// xp[row_of_slot[t*K+k]] = x[t] for every slot.
void launch_permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, float* xp,
                    cudaStream_t stream);
// out[t] = sum_k w[t,k] * yp[row_of_slot[t*K+k]] (k in order, as on the CPU).
void launch_unpermute(const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
                      float* out, cudaStream_t stream);
// act[r, j] = silu(h1[r, j]) * h1[r, F + j].
void launch_swiglu(const float* h1, int64_t rows, int ffn, float* act, cudaStream_t stream);
// Grouped GEMM: for each group g with rows [row_offsets[g], row_offsets[g+1]) (host array),
// C_g[rows x n] = A_g[rows x k] * B_g[k x n], B_g = B + g * k * n; row-major; empty groups are skipped.
void grouped_gemm(cublasHandle_t handle, const float* A, const float* B, float* C, const int64_t* row_offsets,
                  int groups, int k, int n, cudaStream_t stream);

}  // namespace lcplan::moe::gpu
