#include "kernels/moe/moe_cuda.h"

#include "kernels/common/cuda_check.h"

namespace lcplan::moe::gpu {

namespace {

__global__ void route_kernel(const float* logits, const float* bias, RouterParams p, int tokens, float* scores,
                             int* idx, float* w) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  route_token(p, logits + size_t(t) * p.experts, bias, scores + size_t(t) * p.experts, idx + size_t(t) * p.top_k,
              w + size_t(t) * p.top_k);
}

__global__ void expert_major_rows_kernel(const int* expert_of_slot, int n, int experts, int* offsets,
                                         int* row_of_slot) {
  expert_major_rows(expert_of_slot, n, experts, offsets, row_of_slot);
}

__global__ void permute_kernel(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, float* xp) {
  const int slot = blockIdx.x;  // one block per slot, threads over hidden
  if (slot >= tokens * top_k) return;
  const float* src = x + size_t(slot / top_k) * hidden;
  float* dst = xp + size_t(row_of_slot[slot]) * hidden;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
}

__global__ void unpermute_kernel(const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k,
                                 int hidden, float* out) {
  const int t = blockIdx.x;
  if (t >= tokens) return;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0;
    for (int k = 0; k < top_k; ++k)
      acc += w[size_t(t) * top_k + k] * yp[size_t(row_of_slot[t * top_k + k]) * hidden + h];
    out[size_t(t) * hidden + h] = acc;
  }
}

__global__ void swiglu_kernel(const float* h1, int64_t rows, int ffn, float* act) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * ffn) return;
  const int64_t r = i / ffn, j = i % ffn;
  act[i] = swiglu(h1[r * 2 * ffn + j], h1[r * 2 * ffn + ffn + j]);
}

}  // namespace

void launch_route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
                  float* w, cudaStream_t stream) {
  if (tokens == 0) return;
  route_kernel<<<(tokens + 127) / 128, 128, 0, stream>>>(logits, bias, p, tokens, scores, idx, w);
  CUDA_CHECK(cudaGetLastError());
}

void launch_expert_major_rows(const int* expert_of_slot, int n, int experts, int* offsets, int* row_of_slot,
                              cudaStream_t stream) {
  expert_major_rows_kernel<<<1, 1, 0, stream>>>(expert_of_slot, n, experts, offsets, row_of_slot);
  CUDA_CHECK(cudaGetLastError());
}

void launch_permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, float* xp,
                    cudaStream_t stream) {
  if (tokens * top_k == 0) return;
  permute_kernel<<<tokens * top_k, 128, 0, stream>>>(x, row_of_slot, tokens, top_k, hidden, xp);
  CUDA_CHECK(cudaGetLastError());
}

void launch_unpermute(const float* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
                      float* out, cudaStream_t stream) {
  if (tokens == 0) return;
  unpermute_kernel<<<tokens, 128, 0, stream>>>(yp, row_of_slot, w, tokens, top_k, hidden, out);
  CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu(const float* h1, int64_t rows, int ffn, float* act, cudaStream_t stream) {
  const int64_t n = rows * ffn;
  if (n == 0) return;
  swiglu_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(h1, rows, ffn, act);
  CUDA_CHECK(cudaGetLastError());
}

void grouped_gemm(cublasHandle_t handle, const float* A, const float* B, float* C, const int64_t* row_offsets,
                  int groups, int k, int n, cudaStream_t stream) {
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float one = 1.0f, zero = 0.0f;
  for (int g = 0; g < groups; ++g) {
    const int64_t r0 = row_offsets[g], m = row_offsets[g + 1] - row_offsets[g];
    if (m == 0) continue;  // experts that received nothing launch nothing
    // Row-major C = A B is column-major C^T = B^T A^T.
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, int(m), k, &one, B + size_t(g) * k * n, n,
                             A + r0 * k, k, &zero, C + r0 * n, n));
  }
}

}  // namespace lcplan::moe::gpu
