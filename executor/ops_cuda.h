// The executor's small ops on CUDA (the GPU backend's building blocks): the same contracts as ops.h,
// on the per-element math of ops_math.h. Simple and correct rather than fast: one thread block per row
// for the norms (fp64 tree reduction, so a row's result does not depend on the launch), one thread per element
// elsewhere, one thread per column for weight gradients (rows summed in order: deterministic, no atomics). SwiGLU
// and the bf16 cast are the MoE kernels' (kernels/moe/moe_kernels_cuda.h), reached through the same op names.
//
// Launchers follow DeepEP's shape: device pointers, explicit sizes, caller-owned workspace and cuBLAS handle, stream
// last; every launch is checked. In-place calls (y == x, dx == dy) are allowed where ops.h allows them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "executor/ops_math.h"
#include "kernels/common/bf16.h"

namespace lcplan::exec::cuda {

void round_bf16_inplace(float* x, size_t n, cudaStream_t stream);
void to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream);
void to_f32(const bf16* x, float* y, size_t n, cudaStream_t stream);

// y[rows x h] = RMSNorm(x) * w (y may equal x).
void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h, cudaStream_t stream);
// Workspace of the norm backwards: each row's rstd and mean dot product (2 doubles per row).
size_t norm_bwd_workspace_bytes(int64_t rows);
// dx (= or +=) and dw (+=, may be null) from x, w and dy; dx may equal dy.
void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                 bool accumulate_dx, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Gated RMSNorm of each of `heads` heads of width dv per row: y = x / rms(x) * w * silu(z) (w has dv elements).
void gated_norm(const float* x, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv,
                cudaStream_t stream);
// dx, dz overwritten; dw += (dv elements).
void gated_norm_bwd(const float* x, const float* z, const bf16* w, const float* dy, float* dx, float* dz, float* dw,
                    int64_t rows, int64_t heads, int64_t dv, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream);

// Same contracts as ops.h gdn_gates / gdn_gates_bwd (the Gated DeltaNet decay and beta, and their backward).
void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
               int64_t T, int64_t lv, float* gb, cudaStream_t stream);
void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                   const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                   float* dproj, float* d_dt_bias, float* d_a_log, cudaStream_t stream);

// go[n] = bf16(o * sigmoid(gate)); backward: d_o, d_gate overwritten.
void output_gate(const float* o, const float* gate, float* go, size_t n, cudaStream_t stream);
void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n,
                     cudaStream_t stream);

// Same contracts as ops.h embedding_rows / embedding_rows_bwd (tokens is a device array). The backward runs one
// thread per hidden column over the tokens in order: the CPU's order of additions, no atomics.
void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl, float* out,
                    cudaStream_t stream);
void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                        float* g, cudaStream_t stream);

// act[rows x f] = silu(h1[:, :f]) * h1[:, f:]; and its backward into dh1[rows x 2f].
void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f, cudaStream_t stream);
void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f, cudaStream_t stream);

// One Adam step over n elements: m, v, master updated from g; p (may be null) gets bf16(master).
void adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n, const math::AdamScalars& a,
          cudaStream_t stream);

// Same contracts as ops.h add_bias / bias_bwd; the backward runs one thread per column over the rows in order (the
// CPU's order of additions).
void add_bias(float* y, const bf16* b, int64_t rows, int64_t n, cudaStream_t stream);
void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db, cudaStream_t stream);

// y[i] += x[i] over n elements (the FSDP shard's gradient accumulation).
void add_inplace(const float* x, float* y, size_t n, cudaStream_t stream);
// out[i] = bf16(a[i] + b[i]) (the residual connection; out may equal a or b).
void residual(const float* a, const float* b, float* out, size_t n, cudaStream_t stream);
// *out (device) = sum of x[i]^2 over n elements in fp64: one block, each thread over its strided elements in order,
// then a fixed tree, so the value does not depend on the launch (the gradient norm is deterministic).
void sum_squares(const float* x, size_t n, double* out, cudaStream_t stream);

// GEMMs against bf16 weights in fp32 (cuBLAS, no TF32: CUBLAS_COMPUTE_32F_PEDANTIC). W is widened to fp32 in the
// workspace first, as ops.h widens it on the CPU (there in fp64).
size_t matmul_workspace_bytes(int64_t k, int64_t n);
// y[rows x n] = x[rows x k] W[k x n].
void matmul(cublasHandle_t handle, const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n,
            void* workspace, size_t workspace_bytes, cudaStream_t stream);
// dx[rows x k] (= or +=) dy W^T (skipped when dx is null); dW[k x n] += x^T dy (skipped when dW is null).
void matmul_bwd(cublasHandle_t handle, const float* x, const bf16* W, const float* dy, float* dx, float* dW,
                int64_t rows, int64_t k, int64_t n, bool accumulate_dx, void* workspace, size_t workspace_bytes,
                cudaStream_t stream);

}  // namespace lcplan::exec::cuda
