#include "kernels/moe/moe_kernels_cuda.h"

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"

namespace lcplan::moe::gpu {

namespace {

constexpr int kThreads = 128;  // block size of the row kernels (the reductions below assume it)

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// Sum of one value per thread over a kThreads block; every thread gets the result.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0;
  for (int i = 0; i < kThreads / 32; ++i) s += scratch[i];
  __syncthreads();  // scratch is reused by the caller's next reduction
  return s;
}

unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__global__ void route_kernel(const float* logits, const float* bias, RouterParams p, int tokens, float* scores,
                             int* idx, float* w) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  route_token(p, logits + size_t(t) * p.experts, bias, scores + size_t(t) * p.experts, idx + size_t(t) * p.top_k,
              w + size_t(t) * p.top_k);
}

__global__ void route_bwd_kernel(const float* scores, const int* idx, const float* dw, RouterParams p, int tokens,
                                 float* dlogits) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  route_token_bwd(p, scores + size_t(t) * p.experts, idx + size_t(t) * p.top_k, dw + size_t(t) * p.top_k,
                  dlogits + size_t(t) * p.experts);
}

__global__ void chunk_counts_kernel(const int* idx, int tokens, int top_k, int experts, ChunkBounds bounds,
                                    int* counts) {
  const int64_t slot = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= int64_t(tokens) * top_k) return;
  const int t = int(slot / top_k);
  int c = 0;
  while (c + 1 < bounds.chunks && t >= bounds.b[c + 1]) ++c;
  atomicAdd(&counts[c * experts + idx[slot]], 1);  // counts commute: atomics do not change the result
}

__global__ void tile_counts_kernel(const int* expert_of_slot, int n, int experts, int tiles, int* counts) {
  const int ti = blockIdx.x * blockDim.x + threadIdx.x;
  if (ti < tiles) tile_expert_counts(expert_of_slot, n, experts, kPermuteTile, ti, counts);
}

__global__ void offsets_kernel(const int* base, int n, int experts, int* offsets) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e <= experts) offsets[e] = expert_offset_from_bases(base, n, experts, kPermuteTile, e);
}

__global__ void tile_scatter_kernel(const int* expert_of_slot, int n, int tiles, int* base, int* row_of_slot) {
  const int ti = blockIdx.x * blockDim.x + threadIdx.x;
  if (ti < tiles) tile_scatter_rows(expert_of_slot, n, kPermuteTile, ti, base, row_of_slot);
}

template <class T>
__global__ void permute_kernel(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, T* xp) {
  const int slot = blockIdx.x;  // one block per slot, threads over hidden
  if (slot >= tokens * top_k) return;
  const float* src = x + size_t(slot / top_k) * hidden;
  T* dst = xp + size_t(row_of_slot[slot]) * hidden;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = from_f<T>(src[h]);
}

template <class T>
__global__ void unpermute_kernel(const T* yp, const int* row_of_slot, const float* w, int tokens, int top_k,
                                 int hidden, const float* shared, const float* gate, float* out) {
  const int t = blockIdx.x;
  if (t >= tokens) return;
  const float g = gate ? gate[t] : 1.0f;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0;
    for (int k = 0; k < top_k; ++k) {
      const float y = to_f(yp[size_t(row_of_slot[t * top_k + k]) * hidden + h]);
      acc += w ? w[size_t(t) * top_k + k] * y : y;
    }
    if (shared) acc += g * shared[size_t(t) * hidden + h];
    out[size_t(t) * hidden + h] = acc;
  }
}

template <class T>
__global__ void unpermute_bwd_kernel(const float* dout, const T* yp, const int* row_of_slot, const float* w,
                                     int tokens, int top_k, int hidden, T* dyp, float* dw) {
  __shared__ float scratch[kThreads / 32];
  const int t = blockIdx.x;
  if (t >= tokens) return;
  const float* d = dout + size_t(t) * hidden;
  for (int k = 0; k < top_k; ++k) {
    const size_t row = size_t(row_of_slot[t * top_k + k]);
    const float wk = w[size_t(t) * top_k + k];
    float dot = 0;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
      dyp[row * hidden + h] = from_f<T>(wk * d[h]);
      dot += d[h] * to_f(yp[row * hidden + h]);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dw[size_t(t) * top_k + k] = dot;
  }
}

template <class T>
__global__ void swiglu_kernel(const float* h1, int64_t rows, int ffn, T* act) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * ffn) return;
  const int64_t r = i / ffn, j = i % ffn;
  act[i] = from_f<T>(swiglu(h1[r * 2 * ffn + j], h1[r * 2 * ffn + ffn + j]));
}

template <class T>
__global__ void swiglu_bwd_kernel(const float* h1, const float* dact, int64_t rows, int ffn, T* dh1) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * ffn) return;
  const int64_t r = i / ffn, j = i % ffn;
  float dg, du;
  swiglu_bwd(h1[r * 2 * ffn + j], h1[r * 2 * ffn + ffn + j], dact[i], &dg, &du);
  dh1[r * 2 * ffn + j] = from_f<T>(dg);
  dh1[r * 2 * ffn + ffn + j] = from_f<T>(du);
}

template <class T>
__global__ void cast_kernel(const float* in, int64_t n, T* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f<T>(in[i]);
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

template <class T>
__global__ void copy_blocks_kernel(const T* in, T* out, const int64_t* blocks, int hidden, bool to_expert_major) {
  const int64_t* blk = blocks + 3 * size_t(blockIdx.y);  // grid.y: row blocks; grid.x strides inside one
  const int64_t from = to_expert_major ? blk[0] : blk[1], to = to_expert_major ? blk[1] : blk[0];
  const int64_t n = blk[2] * hidden;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[to * hidden + i] = in[from * hidden + i];
}

__global__ void shared_gate_kernel(const float* x, const float* g, int tokens, int hidden, float* sgate) {
  __shared__ float scratch[kThreads / 32];
  const int t = blockIdx.x;
  if (t >= tokens) return;
  float z = 0;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) z += x[size_t(t) * hidden + h] * g[h];
  z = block_sum(z, scratch);
  if (threadIdx.x == 0) sgate[t] = sigmoid_(z);
}

template <class T>
__global__ void shared_gate_bwd_kernel(const float* dout, const float* sout, const float* sgate, int tokens,
                                       int hidden, T* dso, float* dz) {
  __shared__ float scratch[kThreads / 32];
  const int t = blockIdx.x;
  if (t >= tokens) return;
  const float g = sgate ? sgate[t] : 1.0f;
  float dot = 0;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float d = dout[size_t(t) * hidden + h];
    dso[size_t(t) * hidden + h] = from_f<T>(g * d);
    if (sgate) dot += d * sout[size_t(t) * hidden + h];
  }
  if (!sgate) return;  // uniform per block: no thread skips the reduction's barriers
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dz[t] = dot * g * (1.0f - g);
}

// Byte offset of the i-th region of a workspace, each region 256-byte aligned.
size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

void launch_route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
                  float* w, cudaStream_t stream) {
  if (tokens == 0) return;
  route_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(logits, bias, p, tokens, scores, idx, w);
  CUDA_CHECK(cudaGetLastError());
}

void launch_route_bwd(const float* scores, const int* idx, const float* dw, const RouterParams& p, int tokens,
                      float* dlogits, cudaStream_t stream) {
  if (tokens == 0) return;
  route_bwd_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(scores, idx, dw, p, tokens, dlogits);
  CUDA_CHECK(cudaGetLastError());
}

void launch_chunk_counts(const int* idx, int tokens, int top_k, int experts, ChunkBounds bounds, int* counts,
                         cudaStream_t stream) {
  if (bounds.chunks < 1 || bounds.chunks > kMaxChunks)
    throw std::invalid_argument("launch_chunk_counts: " + std::to_string(bounds.chunks) + " chunks (1..4)");
  CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * size_t(bounds.chunks) * experts, stream));
  const int64_t n = int64_t(tokens) * top_k;
  if (n == 0) return;
  chunk_counts_kernel<<<grid_for(n, 256), 256, 0, stream>>>(idx, tokens, top_k, experts, bounds, counts);
  CUDA_CHECK(cudaGetLastError());
}

namespace {
struct PermuteWorkspace {
  size_t scan_bytes = 0, counts_off = 0, base_off = 0, total = 0;
};
PermuteWorkspace permute_workspace(int n, int experts) {
  PermuteWorkspace w;
  const int items = experts * tiles_of(n, kPermuteTile);
  if (items > 0)  // size query only: CUB launches nothing when the temp pointer is null
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, w.scan_bytes, static_cast<const int*>(nullptr),
                                             static_cast<int*>(nullptr), items));
  w.counts_off = align256(w.scan_bytes);
  w.base_off = w.counts_off + align256(sizeof(int) * size_t(items));
  w.total = w.base_off + align256(sizeof(int) * size_t(items));
  return w;
}
}  // namespace

size_t expert_major_rows_workspace(int n, int experts) { return permute_workspace(n, experts).total; }

void launch_expert_major_rows(const int* expert_of_slot, int n, int experts, int* offsets, int* row_of_slot,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int) * size_t(experts + 1), stream));
    return;
  }
  const PermuteWorkspace w = permute_workspace(n, experts);
  if (workspace_bytes < w.total)
    throw std::invalid_argument("launch_expert_major_rows: workspace of " + std::to_string(workspace_bytes) +
                                " bytes, needs " + std::to_string(w.total));
  char* ws = static_cast<char*>(workspace);
  int* counts = reinterpret_cast<int*>(ws + w.counts_off);
  int* base = reinterpret_cast<int*>(ws + w.base_off);
  const int tiles = tiles_of(n, kPermuteTile), items = experts * tiles;
  tile_counts_kernel<<<grid_for(tiles, kThreads), kThreads, 0, stream>>>(expert_of_slot, n, experts, tiles, counts);
  CUDA_CHECK(cudaGetLastError());
  size_t scan_bytes = w.scan_bytes;
  // Same iterator types as the size query, so the temp size asked for is the one this call needs.
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(ws, scan_bytes, static_cast<const int*>(counts), base, items, stream));
  offsets_kernel<<<grid_for(experts + 1, kThreads), kThreads, 0, stream>>>(base, n, experts, offsets);
  CUDA_CHECK(cudaGetLastError());
  tile_scatter_kernel<<<grid_for(tiles, kThreads), kThreads, 0, stream>>>(expert_of_slot, n, tiles, base,
                                                                           row_of_slot);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_permute(const float* x, const int* row_of_slot, int tokens, int top_k, int hidden, T* xp,
                    cudaStream_t stream) {
  if (tokens * top_k == 0) return;
  permute_kernel<T><<<tokens * top_k, kThreads, 0, stream>>>(x, row_of_slot, tokens, top_k, hidden, xp);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_unpermute(const T* yp, const int* row_of_slot, const float* w, int tokens, int top_k, int hidden,
                      const float* shared, const float* gate, float* out, cudaStream_t stream) {
  if (tokens == 0) return;
  unpermute_kernel<T><<<tokens, kThreads, 0, stream>>>(yp, row_of_slot, w, tokens, top_k, hidden, shared, gate, out);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_unpermute_bwd(const float* dout, const T* yp, const int* row_of_slot, const float* w, int tokens,
                          int top_k, int hidden, T* dyp, float* dw, cudaStream_t stream) {
  if (tokens == 0) return;
  unpermute_bwd_kernel<T><<<tokens, kThreads, 0, stream>>>(dout, yp, row_of_slot, w, tokens, top_k, hidden, dyp, dw);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_swiglu(const float* h1, int64_t rows, int ffn, T* act, cudaStream_t stream) {
  const int64_t n = rows * ffn;
  if (n == 0) return;
  swiglu_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(h1, rows, ffn, act);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, T* dh1, cudaStream_t stream) {
  const int64_t n = rows * ffn;
  if (n == 0) return;
  swiglu_bwd_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(h1, dact, rows, ffn, dh1);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_cast(const float* in, int64_t n, T* out, cudaStream_t stream) {
  if (n == 0) return;
  cast_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(in, n, out);
  CUDA_CHECK(cudaGetLastError());
}

void launch_add(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(a, b, n, out);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_copy_blocks(const T* in, T* out, const int64_t* blocks, int nblocks, int64_t max_rows, int hidden,
                        bool to_expert_major, cudaStream_t stream) {
  if (nblocks == 0 || max_rows == 0) return;
  if (nblocks > 65535)
    throw std::invalid_argument("launch_copy_blocks: " + std::to_string(nblocks) +
                                " row blocks exceed the grid's y limit 65535 (sources x local experts)");
  // Enough CUDA blocks per row block to fill the GPU on the largest one; smaller ones exit early.
  const int64_t per = std::min<int64_t>(std::max<int64_t>(1, (max_rows * hidden + 2047) / 2048), 1024);
  copy_blocks_kernel<T><<<dim3(unsigned(per), unsigned(nblocks)), 256, 0, stream>>>(in, out, blocks, hidden,
                                                                                     to_expert_major);
  CUDA_CHECK(cudaGetLastError());
}

void launch_shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate, cudaStream_t stream) {
  if (tokens == 0) return;
  shared_gate_kernel<<<tokens, kThreads, 0, stream>>>(x, g, tokens, hidden, sgate);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void launch_shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, T* dso,
                            float* dz, cudaStream_t stream) {
  if (tokens == 0) return;
  shared_gate_bwd_kernel<T><<<tokens, kThreads, 0, stream>>>(dout, sout, sgate, tokens, hidden, dso, dz);
  CUDA_CHECK(cudaGetLastError());
}

void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* A,
          const void* B, void* C, cudaDataType_t ab, cudaDataType_t c, float alpha, float beta, bool pedantic,
          cudaStream_t stream) {
  if (m == 0 || n == 0 || (k == 0 && beta == 1.0f)) return;  // nothing to add (an expert with no rows in wgrad)
  if (k == 0) throw std::invalid_argument("gemm: k = 0 with beta != 1 would leave C undefined");
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    throw std::invalid_argument("gemm: a dimension exceeds cuBLAS's 32-bit int (" + std::to_string(m) + "x" +
                                std::to_string(n) + "x" + std::to_string(k) + ")");
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = int(trans_b ? k : n), lda = int(trans_a ? m : k), ldc = int(n);
  CUBLAS_CHECK(cublasGemmEx(handle, ob, oa, int(n), int(m), int(k), &alpha, B, ab, ldb, A, ab, lda, &beta, C, c, ldc,
                            pedantic ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void grouped_gemm(cublasHandle_t handle, bool trans_b, const void* A, const void* B, void* C,
                  const int64_t* row_offsets, int groups, int64_t k, int64_t n, cudaDataType_t ab, cudaDataType_t c,
                  cudaStream_t stream) {
  auto bytes = [](cudaDataType_t t) -> size_t {
    if (t == CUDA_R_32F) return 4;
    if (t == CUDA_R_16BF) return 2;
    throw std::invalid_argument("grouped_gemm: only CUDA_R_32F and CUDA_R_16BF operands are supported");
  };
  const size_t eab = bytes(ab), ec = bytes(c);
  for (int g = 0; g < groups; ++g) {
    const int64_t r0 = row_offsets[g], m = row_offsets[g + 1] - r0;
    if (m == 0) continue;  // experts that received nothing launch nothing
    gemm(handle, false, trans_b, m, n, k, static_cast<const char*>(A) + size_t(r0) * k * eab,
         static_cast<const char*>(B) + size_t(g) * k * n * eab, static_cast<char*>(C) + size_t(r0) * n * ec, ab, c,
         1.0f, 0.0f, false, stream);
  }
}

// Explicit instantiations for the two token types.
#define LCPLAN_MOE_INSTANTIATE(T)                                                                                \
  template void launch_permute<T>(const float*, const int*, int, int, int, T*, cudaStream_t);                    \
  template void launch_unpermute<T>(const T*, const int*, const float*, int, int, int, const float*, const float*, \
                                    float*, cudaStream_t);                                                       \
  template void launch_unpermute_bwd<T>(const float*, const T*, const int*, const float*, int, int, int, T*,     \
                                        float*, cudaStream_t);                                                   \
  template void launch_swiglu<T>(const float*, int64_t, int, T*, cudaStream_t);                                  \
  template void launch_swiglu_bwd<T>(const float*, const float*, int64_t, int, T*, cudaStream_t);                \
  template void launch_cast<T>(const float*, int64_t, T*, cudaStream_t);                                         \
  template void launch_copy_blocks<T>(const T*, T*, const int64_t*, int, int64_t, int, bool, cudaStream_t);               \
  template void launch_shared_gate_bwd<T>(const float*, const float*, const float*, int, int, T*, float*,        \
                                          cudaStream_t);
LCPLAN_MOE_INSTANTIATE(float)
LCPLAN_MOE_INSTANTIATE(bf16)
#undef LCPLAN_MOE_INSTANTIATE

}  // namespace lcplan::moe::gpu
