// CUDA attention (see attention_cuda.h). Every per-element decision (visibility, online softmax, final lse,
// probabilities from lse, d score, merge weights, RoPE rotation) is a call into attention_math.h, the code the CPU
// path runs; only the loops and the staging through shared memory are written here.
#include "kernels/attention/attention_cuda.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"

namespace lcplan::attention::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kFwdBq = 16, kFwdBk = 32;  // forward tile
constexpr int kBwdBq = 16, kBwdBk = 16;  // backward tiles

struct Params {
  int64_t sq, sk, hq, hkv, d, q_start, k_start, window;
  int causal;
  float scale;
};

Params params(const Shape& s, const Options& o) {
  return Params{s.sq, s.sk, s.hq, s.hkv, s.d, o.q_start, o.k_start, o.window, o.causal ? 1 : 0, resolved_scale(s, o)};
}

size_t fwd_smem_floats(int64_t d) { return size_t(kFwdBq * d * 2 + 2 * kFwdBk * (d + 1) + kFwdBq * kFwdBk + 3 * kFwdBq); }
size_t dq_smem_floats(int64_t d) { return size_t(kBwdBq * d * 3 + 2 * kBwdBk * (d + 1) + kBwdBq * kBwdBk + 2 * kBwdBq); }
size_t dkdv_smem_floats(int64_t d) {
  return size_t(4 * kBwdBk * d + 2 * kBwdBq * (d + 1) + 2 * kBwdBq * kBwdBk + 2 * kBwdBq);
}

// Opts the kernel in to more than 48 KB of dynamic shared memory when needed; refuses a head dim the device cannot
// hold.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* which, int64_t d) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > static_cast<size_t>(optin))
    throw std::invalid_argument("attention: head dim d (" + std::to_string(d) + ") needs " + std::to_string(bytes) +
                                " bytes of shared memory per block in the CUDA " + which +
                                " kernel, more than this device's " + std::to_string(optin) + ".");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned grid_1d(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)));
}

__device__ float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t x = 0; x < n; ++x) acc += a[x] * b[x];
  return acc;
}

// One block per (query tile, query head). Shared: q tile (pre-scaled), k and v tiles (row pitch d + 1 against bank
// conflicts), score tile, output accumulator, running max / sum / rescale factor.
__global__ void fwd_kernel(Params p, const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ float sm[];
  const int64_t d = p.d, ld = d + 1;
  const int64_t h = blockIdx.y, kh = h / (p.hq / p.hkv);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kFwdBq;
  const int64_t rows = imin(kFwdBq, p.sq - i0);
  float* qs = sm;
  float* ks = qs + kFwdBq * d;
  float* vs = ks + kFwdBk * ld;
  float* ss = vs + kFwdBk * ld;
  float* acc = ss + kFwdBq * kFwdBk;
  float* ms = acc + kFwdBq * d;
  float* ls = ms + kFwdBq;
  float* al = ls + kFwdBq;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t e = tid; e < kFwdBq * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    qs[e] = r < rows ? q[((i0 + r) * p.hq + h) * d + c] * p.scale : 0.0f;
    acc[e] = 0.0f;
  }
  for (int r = tid; r < kFwdBq; r += nt) ms[r] = -INFINITY, ls[r] = 0.0f, al[r] = 1.0f;
  int64_t lo = 0, hi = 0, unused = 0;
  visible_key_range(p.q_start + i0, p.k_start, p.sk, p.causal != 0, p.window, &lo, &unused);
  visible_key_range(p.q_start + i0 + rows - 1, p.k_start, p.sk, p.causal != 0, p.window, &unused, &hi);
  __syncthreads();
  for (int64_t j0 = lo; j0 < hi; j0 += kFwdBk) {
    const int64_t cols = imin(kFwdBk, hi - j0);
    for (int64_t e = tid; e < kFwdBk * d; e += nt) {
      const int64_t r = e / d, c = e % d;
      const bool in = r < cols;
      ks[r * ld + c] = in ? k[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
      vs[r * ld + c] = in ? v[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < kFwdBq * kFwdBk; e += nt) {
      const int r = e / kFwdBk, c = e % kFwdBk;
      float sv = -INFINITY;
      if (r < rows && c < cols &&
          key_visible(p.q_start + i0 + r, p.k_start + j0 + c, p.causal != 0, p.window))
        sv = dot(qs + r * d, ks + c * ld, d);
      ss[e] = sv;
    }
    __syncthreads();
    for (int r = tid; r < rows; r += nt) al[r] = online_softmax_row(ss + r * kFwdBk, cols, &ms[r], &ls[r]);
    __syncthreads();
    for (int64_t e = tid; e < rows * d; e += nt) {
      const int64_t r = e / d, c = e % d;
      float a = acc[e] * al[r];
      for (int64_t j = 0; j < cols; ++j) a += ss[r * kFwdBk + j] * vs[j * ld + c];
      acc[e] = a;
    }
    __syncthreads();
  }
  for (int64_t e = tid; e < rows * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    o[((i0 + r) * p.hq + h) * d + c] = acc[e] * final_inv_l(ls[r]);
  }
  for (int r = tid; r < rows; r += nt) lse[h * p.sq + i0 + r] = final_lse(ms[r], ls[r]);
}

// D_i = rowsum(do_i * o_i), [Hq x Sq].
__global__ void row_dot_kernel(Params p, const float* __restrict__ d_o, const float* __restrict__ o,
                               float* __restrict__ di) {
  const int64_t n = p.sq * p.hq;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / p.hq, h = e % p.hq;
    di[h * p.sq + i] = dot(d_o + e * p.d, o + e * p.d, p.d);
  }
}

// dq: one block per (query tile, query head), looping over the visible key tiles.
__global__ void dq_kernel(Params p, const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ d_o,
                          const float* __restrict__ di, float* __restrict__ dq) {
  extern __shared__ float sm[];
  const int64_t d = p.d, ld = d + 1;
  const int64_t h = blockIdx.y, kh = h / (p.hq / p.hkv);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBwdBq;
  const int64_t rows = imin(kBwdBq, p.sq - i0);
  float* qs = sm;
  float* dos = qs + kBwdBq * d;
  float* dqa = dos + kBwdBq * d;
  float* ks = dqa + kBwdBq * d;
  float* vs = ks + kBwdBk * ld;
  float* ds = vs + kBwdBk * ld;
  float* lse_s = ds + kBwdBq * kBwdBk;
  float* di_s = lse_s + kBwdBq;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t e = tid; e < kBwdBq * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    const bool in = r < rows;
    qs[e] = in ? q[((i0 + r) * p.hq + h) * d + c] * p.scale : 0.0f;
    dos[e] = in ? d_o[((i0 + r) * p.hq + h) * d + c] : 0.0f;
    dqa[e] = 0.0f;
  }
  for (int r = tid; r < kBwdBq; r += nt) {
    lse_s[r] = r < rows ? lse[h * p.sq + i0 + r] : -INFINITY;
    di_s[r] = r < rows ? di[h * p.sq + i0 + r] : 0.0f;
  }
  int64_t lo = 0, hi = 0, unused = 0;
  visible_key_range(p.q_start + i0, p.k_start, p.sk, p.causal != 0, p.window, &lo, &unused);
  visible_key_range(p.q_start + i0 + rows - 1, p.k_start, p.sk, p.causal != 0, p.window, &unused, &hi);
  __syncthreads();
  for (int64_t j0 = lo; j0 < hi; j0 += kBwdBk) {
    const int64_t cols = imin(kBwdBk, hi - j0);
    for (int64_t e = tid; e < kBwdBk * d; e += nt) {
      const int64_t r = e / d, c = e % d;
      const bool in = r < cols;
      ks[r * ld + c] = in ? k[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
      vs[r * ld + c] = in ? v[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
    }
    __syncthreads();
    for (int e = tid; e < kBwdBq * kBwdBk; e += nt) {
      const int r = e / kBwdBk, c = e % kBwdBk;
      float g = 0.0f;
      if (r < rows && c < cols && key_visible(p.q_start + i0 + r, p.k_start + j0 + c, p.causal != 0, p.window)) {
        const float pr = prob_from_lse(dot(qs + r * d, ks + c * ld, d), lse_s[r]);
        g = dscore(pr, dot(dos + r * d, vs + c * ld, d), di_s[r]);
      }
      ds[e] = g;
    }
    __syncthreads();
    for (int64_t e = tid; e < rows * d; e += nt) {
      const int64_t r = e / d, c = e % d;
      float a = 0.0f;
      for (int64_t j = 0; j < cols; ++j) a += ds[r * kBwdBk + j] * ks[j * ld + c];
      dqa[e] += p.scale * a;
    }
    __syncthreads();
  }
  for (int64_t e = tid; e < rows * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    dq[((i0 + r) * p.hq + h) * d + c] = dqa[e];
  }
}

// dk, dv: one block per (key tile, kv head), looping over the group's query heads and their visible query tiles.
__global__ void dkdv_kernel(Params p, const float* __restrict__ q, const float* __restrict__ k,
                            const float* __restrict__ v, const float* __restrict__ lse,
                            const float* __restrict__ d_o, const float* __restrict__ di, float* __restrict__ dk,
                            float* __restrict__ dv) {
  extern __shared__ float sm[];
  const int64_t d = p.d, ld = d + 1;
  const int64_t kh = blockIdx.y, group = p.hq / p.hkv;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBwdBk;
  const int64_t cols = imin(kBwdBk, p.sk - j0);
  float* ks = sm;
  float* vs = ks + kBwdBk * d;
  float* dka = vs + kBwdBk * d;
  float* dva = dka + kBwdBk * d;
  float* qs = dva + kBwdBk * d;
  float* dos = qs + kBwdBq * ld;
  float* ps = dos + kBwdBq * ld;
  float* ds = ps + kBwdBq * kBwdBk;
  float* lse_s = ds + kBwdBq * kBwdBk;
  float* di_s = lse_s + kBwdBq;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t e = tid; e < kBwdBk * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    const bool in = r < cols;
    ks[e] = in ? k[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
    vs[e] = in ? v[((j0 + r) * p.hkv + kh) * d + c] : 0.0f;
    dka[e] = 0.0f;
    dva[e] = 0.0f;
  }
  int64_t qlo = 0, qhi = 0;
  visible_query_range(p.k_start + j0, p.k_start + j0 + cols - 1, p.q_start, p.sq, p.causal != 0, p.window, &qlo, &qhi);
  __syncthreads();
  for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    for (int64_t i0 = qlo; i0 < qhi; i0 += kBwdBq) {
      const int64_t rows = imin(kBwdBq, qhi - i0);
      for (int64_t e = tid; e < kBwdBq * d; e += nt) {
        const int64_t r = e / d, c = e % d;
        const bool in = r < rows;
        qs[r * ld + c] = in ? q[((i0 + r) * p.hq + h) * d + c] : 0.0f;
        dos[r * ld + c] = in ? d_o[((i0 + r) * p.hq + h) * d + c] : 0.0f;
      }
      for (int r = tid; r < kBwdBq; r += nt) {
        lse_s[r] = r < rows ? lse[h * p.sq + i0 + r] : -INFINITY;
        di_s[r] = r < rows ? di[h * p.sq + i0 + r] : 0.0f;
      }
      __syncthreads();
      for (int e = tid; e < kBwdBq * kBwdBk; e += nt) {
        const int r = e / kBwdBk, c = e % kBwdBk;
        float pr = 0.0f, g = 0.0f;
        if (r < rows && c < cols && key_visible(p.q_start + i0 + r, p.k_start + j0 + c, p.causal != 0, p.window)) {
          pr = prob_from_lse(p.scale * dot(qs + r * ld, ks + c * d, d), lse_s[r]);
          g = dscore(pr, dot(dos + r * ld, vs + c * d, d), di_s[r]);
        }
        ps[e] = pr;
        ds[e] = g;
      }
      __syncthreads();
      for (int64_t e = tid; e < cols * d; e += nt) {
        const int64_t c = e / d, x = e % d;
        float a = 0.0f, b = 0.0f;
        for (int64_t r = 0; r < rows; ++r) {
          a += ps[r * kBwdBk + c] * dos[r * ld + x];
          b += ds[r * kBwdBk + c] * qs[r * ld + x];
        }
        dva[e] += a;
        dka[e] += p.scale * b;
      }
      __syncthreads();
    }
  }
  for (int64_t e = tid; e < cols * d; e += nt) {
    const int64_t r = e / d, c = e % d;
    dk[((j0 + r) * p.hkv + kh) * d + c] = dka[e];
    dv[((j0 + r) * p.hkv + kh) * d + c] = dva[e];
  }
}

__global__ void merge_o_kernel(int64_t sq, int64_t hq, int64_t d, const float* o_a, const float* lse_a,
                               const float* o_b, const float* lse_b, float* o) {
  const int64_t n = sq * hq * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / (hq * d), h = (e / d) % hq;
    const float la = lse_a[h * sq + i], lb = lse_b[h * sq + i];
    const float lt = lse_add(la, lb);
    o[e] = merge_weight(la, lt) * o_a[e] + merge_weight(lb, lt) * o_b[e];
  }
}

__global__ void merge_lse_kernel(int64_t n, const float* lse_a, const float* lse_b, float* lse) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    lse[e] = lse_add(lse_a[e], lse_b[e]);
}

// One thread per (token, head, pair); dims past rotary_dim are copied when out of place.
__global__ void rope_kernel(int64_t s, int64_t h, int64_t d, int64_t r, float theta, int64_t start, float sign,
                            const float* x, float* y) {
  const int64_t half = r / 2, per_row = half + (d - r);
  const int64_t n = s * h * per_row;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / per_row, i = e % per_row, t = row / h;
    const float* a = x + row * d;
    float* b = y + row * d;
    if (i < half) {
      float c = 0.0f, sn = 0.0f;
      rope_cos_sin(start + t, rope_inv_freq(i, r, theta), &c, &sn);
      rope_rotate(a[i], a[i + half], c, sign * sn, &b[i], &b[i + half]);
    } else if (a != b) {
      const int64_t j = r + (i - half);
      b[j] = a[j];
    }
  }
}

void rope_launch(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o, float sign,
                 cudaStream_t stream) {
  validate_rope(s, h, d, o);
  if (s == 0) return;
  if (x == nullptr || y == nullptr) throw std::invalid_argument("attention: rope input or output is null but the shape is not empty.");
  const int64_t r = o.rotary_dim < 0 ? d : o.rotary_dim;
  rope_kernel<<<grid_1d(s * h * (r / 2 + d - r)), kThreads, 0, stream>>>(s, h, d, r, o.theta, o.start, sign, x, y);
  CUDA_CHECK(cudaGetLastError());
}

void need(const void* ptr, const char* name) {
  if (ptr == nullptr) throw std::invalid_argument(std::string("attention: ") + name + " is null but the shape is not empty.");
}

}  // namespace

void forward(const Shape& s, const float* q, const float* k, const float* v, float* o, float* lse, const Options& opt,
             cudaStream_t stream) {
  validate(s, opt);
  if (s.sq == 0) return;
  need(q, "q"), need(o, "o"), need(lse, "lse");
  if (s.sk > 0) need(k, "k"), need(v, "v");
  const size_t smem = fwd_smem_floats(s.d) * sizeof(float);
  allow_smem(fwd_kernel, smem, "forward", s.d);
  const dim3 grid(static_cast<unsigned>((s.sq + kFwdBq - 1) / kFwdBq), static_cast<unsigned>(s.hq));
  fwd_kernel<<<grid, kThreads, smem, stream>>>(params(s, opt), q, k, v, o, lse);
  CUDA_CHECK(cudaGetLastError());
}

size_t backward_workspace_bytes(const Shape& s) {
  return static_cast<size_t>(std::max<int64_t>(s.hq * s.sq, 1)) * sizeof(float);
}

void backward(const Shape& s, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* d_o, float* dq, float* dk, float* dv, const Options& opt, void* workspace,
              size_t workspace_bytes, cudaStream_t stream) {
  validate(s, opt);
  if (s.sq > 0) need(q, "q"), need(o, "o"), need(lse, "lse"), need(d_o, "d_o"), need(dq, "dq");
  if (s.sk > 0) need(k, "k"), need(v, "v"), need(dk, "dk"), need(dv, "dv");
  if (workspace_bytes < backward_workspace_bytes(s) || workspace == nullptr)
    throw std::invalid_argument("attention: backward workspace (" + std::to_string(workspace_bytes) +
                                " bytes) must be non-null and hold at least " +
                                std::to_string(backward_workspace_bytes(s)) + " bytes.");
  const Params p = params(s, opt);
  float* di = static_cast<float*>(workspace);
  if (s.sq > 0) {
    row_dot_kernel<<<grid_1d(s.sq * s.hq), kThreads, 0, stream>>>(p, d_o, o, di);
    CUDA_CHECK(cudaGetLastError());
    const size_t smem = dq_smem_floats(s.d) * sizeof(float);
    allow_smem(dq_kernel, smem, "dq", s.d);
    const dim3 grid(static_cast<unsigned>((s.sq + kBwdBq - 1) / kBwdBq), static_cast<unsigned>(s.hq));
    dq_kernel<<<grid, kThreads, smem, stream>>>(p, q, k, v, lse, d_o, di, dq);
    CUDA_CHECK(cudaGetLastError());
  }
  if (s.sk > 0) {
    const size_t smem = dkdv_smem_floats(s.d) * sizeof(float);
    allow_smem(dkdv_kernel, smem, "dk/dv", s.d);
    const dim3 grid(static_cast<unsigned>((s.sk + kBwdBk - 1) / kBwdBk), static_cast<unsigned>(s.hkv));
    dkdv_kernel<<<grid, kThreads, smem, stream>>>(p, q, k, v, lse, d_o, di, dk, dv);
    CUDA_CHECK(cudaGetLastError());
  }
}

void merge_partials(int64_t sq, int64_t hq, int64_t d, const float* o_a, const float* lse_a, const float* o_b,
                    const float* lse_b, float* o, float* lse, cudaStream_t stream) {
  if (sq < 0 || hq <= 0 || d <= 0)
    throw std::invalid_argument("attention: merge_partials needs sq >= 0, hq >= 1 and d >= 1 (got sq " +
                                std::to_string(sq) + ", hq " + std::to_string(hq) + ", d " + std::to_string(d) + ").");
  if (sq == 0) return;
  need(o_a, "o_a"), need(lse_a, "lse_a"), need(o_b, "o_b"), need(lse_b, "lse_b"), need(o, "o"), need(lse, "lse");
  // o first (it reads lse_a / lse_b), then lse, which may alias them.
  merge_o_kernel<<<grid_1d(sq * hq * d), kThreads, 0, stream>>>(sq, hq, d, o_a, lse_a, o_b, lse_b, o);
  CUDA_CHECK(cudaGetLastError());
  merge_lse_kernel<<<grid_1d(sq * hq), kThreads, 0, stream>>>(sq * hq, lse_a, lse_b, lse);
  CUDA_CHECK(cudaGetLastError());
}

void rope_forward(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o, cudaStream_t stream) {
  rope_launch(s, h, d, x, y, o, 1.0f, stream);
}

void rope_backward(int64_t s, int64_t h, int64_t d, const float* dy, float* dx, const RopeOptions& o,
                   cudaStream_t stream) {
  rope_launch(s, h, d, dy, dx, o, -1.0f, stream);
}

}  // namespace lcplan::attention::cuda
