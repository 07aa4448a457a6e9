// CUDA attention (fp32): forward and backward kernels on the same tile math as the CPU path (attention_math.h),
// the context-parallel merge, and RoPE. Simple and correct rather than fast: one thread block per (query tile, head)
// in the forward and dq kernels, one per (key tile, kv head) in the dk/dv kernel, CUDA cores (no tensor cores),
// tiles staged in shared memory. All pointers are device pointers; launches are asynchronous on `stream` (last).
//
// Shared memory per block grows with the head dim D: forward 96 D + 624 floats, dq 80 D + 320, dk/dv 96 D + 576.
// Above 48 KB the launcher opts in to the device's larger limit and throws std::invalid_argument when D needs more
// than the device offers (D = 256 needs ~101 KB, fine on H100 / H200 / B200 with 227 KB per block).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/attention/attention.h"

namespace lcplan::attention::cuda {

// o [Sq x Hq x D], lse [Hq x Sq] overwritten. Options' q_tile / k_tile are CPU settings and are ignored here.
void forward(const Shape& s, const float* q, const float* k, const float* v, float* o, float* lse, const Options& opt,
             cudaStream_t stream);

// Device workspace of the backward: D_i = rowsum(do * o), Hq * Sq floats.
size_t backward_workspace_bytes(const Shape& s);

// dq [Sq x Hq x D], dk and dv [Sk x Hkv x D] overwritten (no atomics: a dq kernel over query tiles and a dk/dv
// kernel over key tiles, each recomputing the probabilities from lse; deterministic).
void backward(const Shape& s, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* d_o, float* dq, float* dk, float* dv, const Options& opt, void* workspace,
              size_t workspace_bytes, cudaStream_t stream);

// Same contract as attention::merge_partials (outputs may alias inputs).
void merge_partials(int64_t sq, int64_t hq, int64_t d, const float* o_a, const float* lse_a, const float* o_b,
                    const float* lse_b, float* o, float* lse, cudaStream_t stream);

// Same contract as rope_forward_cpu / rope_backward_cpu (in place allowed).
void rope_forward(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o, cudaStream_t stream);
void rope_backward(int64_t s, int64_t h, int64_t d, const float* dy, float* dx, const RopeOptions& o,
                   cudaStream_t stream);

}  // namespace lcplan::attention::cuda
