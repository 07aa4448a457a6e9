// CUDA linear cross-entropy (see linear_ce_cuda.h for the cost model). Loop order matches the CPU path: vocabulary
// tile outer, token tile inner, so each d_weight tile is finished before the next one starts.
#include "kernels/linear_ce/linear_ce_cuda.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"

namespace lcplan::linear_ce::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr size_t kAlign = 256;

size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

// Workspace carved in a fixed order so workspace_bytes() and the launchers agree on it.
struct Layout {
  size_t logits = 0, dtile = 0, m = 0, st = 0, tok = 0, g = 0, de = 0, dw = 0, status = 0, total = 0;
};

// The forward's cross-rank max needs an N-float buffer too: it borrows `tok` (or the loss output for
// Reduction::None), which holds nothing until finalize.
Layout layout(const Problem& p, DType t, const Options& o, bool backward) {
  const size_t n = static_cast<size_t>(p.tokens), h = static_cast<size_t>(p.hidden);
  const size_t nt = static_cast<size_t>(std::min<int64_t>(o.token_tile, std::max<int64_t>(p.tokens, 1)));
  const size_t vt = static_cast<size_t>(std::min<int64_t>(o.vocab_tile, p.vocab));
  const bool b16 = t == DType::BF16;
  Layout l;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(std::max<size_t>(bytes, 1));
    return at;
  };
  l.status = take(2 * sizeof(int));  // [0] bad targets, [1] valid targets
  l.logits = take(nt * vt * sizeof(float));
  if (!backward) {
    l.m = take(n * sizeof(float));
    l.st = take(2 * n * sizeof(float));
    if (o.reduction != Reduction::None) l.tok = take(n * sizeof(float));  // None writes per-token losses to `loss`
  } else {
    l.g = take(n * sizeof(float));
    if (b16) {
      l.dtile = take(nt * vt * sizeof(bf16));
      l.de = take(n * h * sizeof(float));
      l.dw = take(vt * h * sizeof(float));
    }
  }
  l.total = off;
  return l;
}

template <class T>
T* at(void* base, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + off);
}

int as_int(int64_t x, const char* what) {
  if (x > INT_MAX) throw std::invalid_argument(std::string("linear_ce: ") + what + " exceeds a cuBLAS int dimension.");
  return static_cast<int>(x);
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Row-major C[m x n] = op(A) op(B) (+ beta C) through column-major cuBLAS: computes C^T = op(B)^T op(A)^T.
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
             const void* b, int64_t ldb, cudaDataType_t ab_type, float beta, float* c, int64_t ldc) {
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(n, "n"),
                            as_int(m, "m"), as_int(k, "k"), &alpha, b, ab_type, as_int(ldb, "ldb"), a, ab_type,
                            as_int(lda, "lda"), &beta, c, CUDA_R_32F, as_int(ldc, "ldc"), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

const void* offset(const void* p, DType t, int64_t elems) {
  return static_cast<const char*>(p) + static_cast<size_t>(elems) * dtype_bytes(t);
}

__device__ LseState warp_merge(LseState s) {
  for (int off = 16; off > 0; off >>= 1) {
    LseState o{__shfl_xor_sync(0xffffffffu, s.m, off), __shfl_xor_sync(0xffffffffu, s.s, off)};
    s = lse_merge(s, o);
  }
  return s;
}

__global__ void check_targets_kernel(const int64_t* targets, int64_t n, int64_t vocab_total, int64_t ignore,
                                     int* status) {
  int bad = 0, valid = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = targets[i];
    if (is_ignored(t, ignore)) continue;
    if (t < 0 || t >= vocab_total) ++bad;
    else ++valid;
  }
  if (bad) atomicAdd(&status[0], bad);
  if (valid) atomicAdd(&status[1], valid);
}

__global__ void init_state_kernel(float* m, float* st, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    m[i] = -INFINITY;
    st[i] = 0.0f;
    st[n + i] = 0.0f;
  }
}

// Cross-rank combine: each rank re-expresses its sum-exp relative to the all-reduced max before the sums are added.
__global__ void rescale_kernel(float* m, float* s, const float* m_global, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    s[i] = lse_rescale(s[i], m[i], m_global[i]);
    m[i] = m_global[i];
  }
}

// One block per token row of the tile: per-thread online lse, warp then block merge, one merge into the row state.
__global__ void lse_tile_kernel(const float* logits, int64_t vt, int64_t g0, const int64_t* targets, float* m,
                                float* s, float* tl, float cap) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vt;
  LseState st = lse_empty();
  for (int64_t c = threadIdx.x; c < vt; c += blockDim.x) st = lse_push(st, softcap_apply(x[c], cap));
  st = warp_merge(st);
  __shared__ LseState part[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = lane < kWarps ? part[lane] : lse_empty();
    st = warp_merge(st);
    if (lane == 0) {
      const LseState merged = lse_merge(LseState{m[row], s[row]}, st);
      m[row] = merged.m;
      s[row] = merged.s;
      const int64_t tg = targets[row];
      if (tg >= g0 && tg < g0 + vt) tl[row] = softcap_apply(x[tg - g0], cap);
    }
  }
}

__global__ void finalize_kernel(const float* m, const float* s, const float* tl, const int64_t* targets, int64_t n,
                                int64_t ignore, float zloss, float* lse, float* tok_loss) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    lse[i] = lse_value(LseState{m[i], s[i]});
    tok_loss[i] = is_ignored(targets[i], ignore) ? 0.0f : token_loss(lse[i], tl[i], zloss);
  }
}

// Single block: fp64 sum of the per-token losses, divided by the valid count for the mean (0 if none are valid).
__global__ void reduce_loss_kernel(const float* tok_loss, int64_t n, const int* status, Reduction r, float* loss) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += tok_loss[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int valid = status[1];
    loss[0] = r == Reduction::Sum ? static_cast<float>(part[0])
                                  : (valid > 0 ? static_cast<float>(part[0] / valid) : 0.0f);
  }
}

__global__ void row_grad_kernel(const int64_t* targets, int64_t n, int64_t ignore, Reduction r, const float* grad_loss,
                                const int* status, float* g) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    g[i] = upstream_grad(r, is_ignored(targets[i], ignore), grad_loss, i, status[1]);
}

// dlogits of one tile; for fp32 `d` may alias `logits` (each element is read then written by the same thread).
template <class T>
__global__ void grad_tile_kernel(const float* logits, T* d, int64_t vt, int64_t g0, const int64_t* targets,
                                 const float* lse, const float* g, float cap, float zloss) {
  const int64_t row = blockIdx.y;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= vt) return;
  const float gi = g[row];
  const float x = logits[row * vt + c];
  const float v = gi == 0.0f ? 0.0f : logit_grad(softcap_apply(x, cap), lse[row], targets[row] - g0 == c, gi, zloss, cap);
  d[row * vt + c] = from_float<T>(v);
}

__global__ void to_bf16_kernel(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = float_to_bf16(src[i]);
}

void check_args(const Problem& p, const Options& o, bool has_all_reduce, const void* hidden, const void* weight,
                const int64_t* targets, const void* out_a, const void* out_b, void* ws, size_t ws_size, size_t need) {
  validate(p, o);
  validate_shard(p, has_all_reduce);
  if (weight == nullptr || out_a == nullptr ||
      (p.tokens > 0 && (hidden == nullptr || targets == nullptr || out_b == nullptr)))
    throw std::invalid_argument("linear_ce: a required device pointer is null.");
  if (std::min<int64_t>(o.token_tile, p.tokens) > 65535)
    throw std::invalid_argument("linear_ce: token_tile above 65535 exceeds the CUDA grid's y dimension.");
  if (ws == nullptr || ws_size < need)
    throw std::invalid_argument("linear_ce: workspace is " + std::to_string(ws_size) + " bytes but " +
                                std::to_string(need) + " are needed (see cuda::workspace_bytes).");
}

// Waits for the status word the target check wrote and throws if any target was out of range.
void report_bad_targets(const int* status, const Problem& p, cudaStream_t stream) {
  int bad = 0;
  CUDA_CHECK(cudaMemcpyAsync(&bad, status, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad > 0)
    throw std::invalid_argument("linear_ce: " + std::to_string(bad) + " targets are outside [0, " +
                                std::to_string(p.total()) + ") and are not ignore_index; the outputs are invalid.");
}

}  // namespace

size_t workspace_bytes(const Problem& p, DType t, const Options& o) {
  validate(p, o);
  return std::max(layout(p, t, o, false).total, layout(p, t, o, true).total);
}

void forward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
             const int64_t* targets, float* loss, float* lse, const Options& o, void* workspace, size_t workspace_size,
             cudaStream_t stream) {
  forward(handle, p, t, hidden, weight, targets, loss, lse, o, DeviceAllReduce{}, workspace, workspace_size, stream);
}

void forward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
             const int64_t* targets, float* loss, float* lse, const Options& o, const DeviceAllReduce& all_reduce,
             void* workspace, size_t workspace_size, cudaStream_t stream) {
  const Layout l = layout(p, t, o, false);
  check_args(p, o, static_cast<bool>(all_reduce), hidden, weight, targets, loss, lse, workspace, workspace_size,
             l.total);
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  const int64_t nt_max = std::min<int64_t>(o.token_tile, std::max<int64_t>(n, 1));
  const int64_t vt_max = std::min<int64_t>(o.vocab_tile, v);
  int* status = at<int>(workspace, l.status);
  float* logits = at<float>(workspace, l.logits);
  float* m = at<float>(workspace, l.m);
  float* st = at<float>(workspace, l.st);
  float* tok = o.reduction == Reduction::None ? loss : at<float>(workspace, l.tok);
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  CUDA_CHECK(cudaMemsetAsync(status, 0, 2 * sizeof(int), stream));
  if (n > 0) {
    check_targets_kernel<<<grid_for(n), kThreads, 0, stream>>>(targets, n, p.total(), o.ignore_index, status);
    CUDA_CHECK(cudaGetLastError());
    init_state_kernel<<<grid_for(n), kThreads, 0, stream>>>(m, st, n);
    CUDA_CHECK(cudaGetLastError());
  }
  for (int64_t v0 = 0; v0 < v; v0 += vt_max) {
    const int64_t vt = std::min(vt_max, v - v0);
    for (int64_t t0 = 0; t0 < n; t0 += nt_max) {
      const int64_t nt = std::min(nt_max, n - t0);
      gemm_rm(handle, false, true, nt, vt, h, offset(hidden, t, t0 * h), h, offset(weight, t, v0 * h), h, cuda_type(t),
              0.0f, logits, vt);
      lse_tile_kernel<<<static_cast<unsigned>(nt), kThreads, 0, stream>>>(logits, vt, p.vocab_start + v0, targets + t0,
                                                                           m + t0, st + t0, st + n + t0, o.softcap);
      CUDA_CHECK(cudaGetLastError());
    }
  }
  // Every rank holds the same tokens, so all skip (or all run) the combine together.
  if (all_reduce && n > 0) {
    // Same combine as the CPU path: max first, rescale each rank's sum-exp to it, then sum [s, target logit].
    float* m_global = tok;
    CUDA_CHECK(cudaMemcpyAsync(m_global, m, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    all_reduce(m_global, static_cast<size_t>(n), CrossRankOp::Max, stream);
    rescale_kernel<<<grid_for(n), kThreads, 0, stream>>>(m, st, m_global, n);
    CUDA_CHECK(cudaGetLastError());
    all_reduce(st, static_cast<size_t>(2 * n), CrossRankOp::Sum, stream);
  }
  if (n > 0) {
    finalize_kernel<<<grid_for(n), kThreads, 0, stream>>>(m, st, st + n, targets, n, o.ignore_index, o.z_loss, lse, tok);
    CUDA_CHECK(cudaGetLastError());
  }
  if (o.reduction != Reduction::None) {
    reduce_loss_kernel<<<1, kThreads, 0, stream>>>(tok, n, status, o.reduction, loss);
    CUDA_CHECK(cudaGetLastError());
  }
  report_bad_targets(status, p, stream);
}

void backward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
              const int64_t* targets, const float* lse, const float* grad_loss, void* d_hidden, void* d_weight,
              const Options& o, void* workspace, size_t workspace_size, cudaStream_t stream) {
  backward(handle, p, t, hidden, weight, targets, lse, grad_loss, d_hidden, d_weight, o, DeviceAllReduce{}, workspace,
           workspace_size, stream);
}

void backward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
              const int64_t* targets, const float* lse, const float* grad_loss, void* d_hidden, void* d_weight,
              const Options& o, const DeviceAllReduce& all_reduce, void* workspace, size_t workspace_size,
              cudaStream_t stream) {
  const Layout l = layout(p, t, o, true);
  check_args(p, o, static_cast<bool>(all_reduce), hidden, weight, targets, d_weight, d_hidden, workspace,
             workspace_size, l.total);
  if (grad_loss == nullptr || (p.tokens > 0 && lse == nullptr))
    throw std::invalid_argument("linear_ce: grad_loss or lse is null.");
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  const int64_t nt_max = std::min<int64_t>(o.token_tile, std::max<int64_t>(n, 1));
  const int64_t vt_max = std::min<int64_t>(o.vocab_tile, v);
  const bool b16 = t == DType::BF16;
  int* status = at<int>(workspace, l.status);
  float* logits = at<float>(workspace, l.logits);
  float* g = at<float>(workspace, l.g);
  // bf16: dlogits rounded to bf16 for the tensor-core GEMMs, fp32 accumulators; fp32: dlogits in place, outputs
  // accumulate directly.
  void* dtile = b16 ? static_cast<void*>(at<bf16>(workspace, l.dtile)) : static_cast<void*>(logits);
  float* de = b16 ? at<float>(workspace, l.de) : static_cast<float*>(d_hidden);
  float* dw_acc = b16 ? at<float>(workspace, l.dw) : nullptr;
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  CUDA_CHECK(cudaMemsetAsync(status, 0, 2 * sizeof(int), stream));
  if (n > 0) {
    check_targets_kernel<<<grid_for(n), kThreads, 0, stream>>>(targets, n, p.total(), o.ignore_index, status);
    CUDA_CHECK(cudaGetLastError());
    row_grad_kernel<<<grid_for(n), kThreads, 0, stream>>>(targets, n, o.ignore_index, o.reduction, grad_loss, status, g);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(de, 0, static_cast<size_t>(n * h) * sizeof(float), stream));
  }
  for (int64_t v0 = 0; v0 < v; v0 += vt_max) {
    const int64_t vt = std::min(vt_max, v - v0);
    float* dw = b16 ? dw_acc : static_cast<float*>(d_weight) + v0 * h;
    CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(vt * h) * sizeof(float), stream));
    const void* wv = offset(weight, t, v0 * h);
    for (int64_t t0 = 0; t0 < n; t0 += nt_max) {
      const int64_t nt = std::min(nt_max, n - t0);
      const void* et = offset(hidden, t, t0 * h);
      gemm_rm(handle, false, true, nt, vt, h, et, h, wv, h, cuda_type(t), 0.0f, logits, vt);
      const dim3 grid(static_cast<unsigned>((vt + kThreads - 1) / kThreads), static_cast<unsigned>(nt));
      if (b16)
        grad_tile_kernel<bf16><<<grid, kThreads, 0, stream>>>(logits, static_cast<bf16*>(dtile), vt, p.vocab_start + v0,
                                                             targets + t0, lse + t0, g + t0, o.softcap, o.z_loss);
      else
        grad_tile_kernel<float><<<grid, kThreads, 0, stream>>>(logits, static_cast<float*>(dtile), vt,
                                                              p.vocab_start + v0, targets + t0, lse + t0, g + t0,
                                                              o.softcap, o.z_loss);
      CUDA_CHECK(cudaGetLastError());
      // d_weight tile [vt x H] += dlogits^T [vt x nt] * hidden tile [nt x H]
      gemm_rm(handle, true, false, vt, h, nt, dtile, vt, et, h, cuda_type(t), 1.0f, dw, h);
      // d_hidden tile [nt x H] += dlogits [nt x vt] * weight tile [vt x H]
      gemm_rm(handle, false, false, nt, h, vt, dtile, vt, wv, h, cuda_type(t), 1.0f, de + t0 * h, h);
    }
    if (b16) {
      to_bf16_kernel<<<grid_for(vt * h), kThreads, 0, stream>>>(dw, static_cast<bf16*>(d_weight) + v0 * h, vt * h);
      CUDA_CHECK(cudaGetLastError());
    }
  }
  // Each rank saw only its vocabulary rows: the full d_hidden is the sum of the partial ones, taken in fp32.
  if (all_reduce && n > 0) all_reduce(de, static_cast<size_t>(n * h), CrossRankOp::Sum, stream);
  if (b16 && n > 0) {
    to_bf16_kernel<<<grid_for(n * h), kThreads, 0, stream>>>(de, static_cast<bf16*>(d_hidden), n * h);
    CUDA_CHECK(cudaGetLastError());
  }
  report_bad_targets(status, p, stream);
}

}  // namespace lcplan::linear_ce::cuda
