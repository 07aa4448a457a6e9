// CUDA gated delta rule and causal conv1d (fp32), on the same per-element math as the CPU path
// (linear_attention_math.h). Simple and correct rather than fast:
//   forward : the recurrent form, one thread per state column (columns evolve independently given k_t, q_t), grid
//             (Hv, ceil(dv / 128)); the state lives in state_out (global memory, coalesced over columns);
//   backward: one block per value head: chunk-boundary states recomputed into the workspace, then per chunk the
//             per-token states, then the reverse recurrence in three phases per token (per column: delta, dS += q do,
//             dd; per row: dq, dk, dg terms; per element: dS_{t-1}); dq / dk per value head go to the workspace and a
//             second kernel sums each key head's group (deterministic, no atomics);
//   conv1d  : one thread per output (forward) or input (backward) element, one thread per channel for d_weight.
// All pointers are device pointers; launches are asynchronous on `stream` (last).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/linear_attention/linear_attention.h"

namespace lcplan::linear_attention::cuda {

// state_in may be null (zeros) and may equal state_out; state_out is required (it holds the running state).
void forward(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
             const float* state_in, float* o, float* state_out, const Options& opt, cudaStream_t stream);

// Device workspace of the backward: per value head (ceil(s / C) + C + 1) states of dk x dv floats (boundaries, the
// chunk's per-token states, dS), plus two [S x Hv x dk] buffers for the per-value-head dq and dk.
size_t backward_workspace_bytes(const Shape& s, const Options& opt);

// Same contract as backward_cpu (d_state_out and d_state_in may be null).
void backward(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
              const float* state_in, const float* d_o, const float* d_state_out, float* dq, float* dk, float* dv,
              float* dg, float* dbeta, float* d_state_in, const Options& opt, void* workspace, size_t workspace_bytes,
              cudaStream_t stream);

// Same contracts as the CPU conv1d functions (next_history must not alias history).
void conv1d_forward(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                    float* y, cudaStream_t stream);
void conv1d_backward(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                     const float* dy, float* dx, float* d_history, float* d_weight, float* d_bias, cudaStream_t stream);
void conv1d_next_history(const Conv& c, const float* x, const float* history, float* next_history, cudaStream_t stream);

}  // namespace lcplan::linear_attention::cuda
