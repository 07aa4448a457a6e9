// Fixed-order fp32 GEMMs of the CPU MoE layer. Every output element is one sum over the inner index in
// ascending order, started from 0 (or from the existing value when accumulating), so a row's result does not
// depend on how many rows share the call, on row blocking, or on where the row sits in its buffer. That is
// what makes the chunked layer bit-identical to the unchunked one (Eigen picks kernels by matrix shape).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace lcplan::moe::cpu {

// C[rows x n] = A[rows x k] * B[k x n] (accumulate: C += A * B, each element still summed in order after C).
void gemm_nn(const float* A, const float* B, float* C, int64_t rows, int k, int n, bool accumulate = false);

// Bt[k x n] = B[n x k]^T, so C = A * B^T runs through gemm_nn with the same per-element order.
void transpose(const float* B, int n, int k, std::vector<float>& Bt);

// G[k x n] += A[rows x k]^T * D[rows x n], rows in ascending order: G[i][j] = (((G + a0*d0) + a1*d1) + ...).
// Splitting the rows over several calls in order gives the same bits as one call.
void gemm_tn_acc(const float* A, const float* D, float* G, int64_t rows, int k, int n);

// Row-blocked wrappers for the CPU layer: a progress poll (non-blocking MPI) runs between row blocks, and the
// fixed summation order makes each row's result independent of the blocking.
using Poll = std::function<void()>;
// C[rows x n] = A[rows x k] * B[k x n], `block` rows at a time.
void gemm_rows(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block);
// C[rows x n] = A[rows x k] * B[n x k]^T (dgrad through a weight stored k-major): B is transposed once.
void gemm_rows_bt(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block);
// G[k x n] += A[rows x k]^T * D[rows x n] (weight gradient), rows summed in ascending order.
void gemm_at(const float* A, const float* D, float* G, int64_t rows, int k, int n, const Poll& poll = {},
             int block = 1 << 30);

}  // namespace lcplan::moe::cpu
