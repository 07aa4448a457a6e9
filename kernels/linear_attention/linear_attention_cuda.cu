// CUDA gated delta rule and causal conv1d (see linear_attention_cuda.h). The recurrence steps, their gradients, the
// normalisation gradient and the conv / SiLU math are the LCPLAN_HD functions of linear_attention_math.h that the CPU
// path runs; only the thread decomposition and the staging are written here.
#include "kernels/linear_attention/linear_attention_cuda.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"

namespace lcplan::linear_attention::cuda {

namespace {

constexpr int kFwdThreads = 128;  // state columns per forward block
constexpr int kBwdThreads = 256;  // threads of a backward block (one block per value head)
constexpr int kThreads = 256;     // element-wise kernels

struct Params {
  int64_t s, hk, hv, dk, dv, chunk, chunks;
  int l2;
  float eps, scale;
};

Params params(const Shape& s, const Options& o) {
  const int64_t c = std::max<int64_t>(1, std::min(o.chunk, s.s));
  return Params{s.s, s.hk, s.hv, s.dk, s.dv, c, std::max<int64_t>(1, (s.s + c - 1) / c), o.qk_l2norm ? 1 : 0,
                o.l2norm_eps, resolved_scale(s, o)};
}

unsigned grid_1d(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)));
}

void need(const void* p, const char* name) {
  if (p == nullptr)
    throw std::invalid_argument(std::string("linear_attention: ") + name + " is null but the shape is not empty.");
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > static_cast<size_t>(optin))
    throw std::invalid_argument("linear_attention: head dims need " + std::to_string(bytes) +
                                " bytes of shared memory per block, more than this device's " + std::to_string(optin) +
                                ".");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Sum over the block (blockDim.x a power of two); every thread gets the result. All threads must call it.
__device__ float block_sum(float x, float* red) {
  const int tid = threadIdx.x;
  red[tid] = x;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (tid < w) red[tid] += red[tid + w];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// Row x[0, n) into raw (when not null) and into dst normalised (if l2) and scaled; returns 1/norm (1 without l2).
// All threads must call it; dst is complete for every thread on return.
__device__ float load_norm(const float* x, int64_t n, int l2, float eps, float scale, float* dst, float* raw,
                           float* red) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = x[i];
    dst[i] = e;
    if (raw != nullptr) raw[i] = e;
    ss += e * e;
  }
  const float inv = l2 ? l2norm_inv_from_sumsq(block_sum(ss, red), eps) : 1.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = dst[i] * inv * scale;
  __syncthreads();
  return inv;
}

__device__ void block_copy(const float* src, float* dst, int64_t n) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
  __syncthreads();
}

// State-only step of token t on the row-major [dk x dv] state S (one thread per column).
__device__ void advance(const Params& p, int64_t h, int64_t hk, int64_t t, const float* k, const float* v,
                        const float* g, const float* beta, float* S, float* kn, float* red) {
  load_norm(k + (t * p.hk + hk) * p.dk, p.dk, p.l2, p.eps, 1.0f, kn, nullptr, red);
  const float a = decay_of(g[t * p.hv + h]), b = beta[t * p.hv + h];
  for (int64_t j = threadIdx.x; j < p.dv; j += blockDim.x)
    column_forward(S + j, p.dv, kn, nullptr, p.dk, a, b, v[(t * p.hv + h) * p.dv + j]);
  __syncthreads();
}

__global__ void forward_kernel(Params p, const float* __restrict__ q, const float* __restrict__ k,
                               const float* __restrict__ v, const float* __restrict__ g,
                               const float* __restrict__ beta, const float* state_in, float* __restrict__ o,
                               float* state_out) {
  extern __shared__ float sm[];
  float* kn = sm;
  float* qn = kn + p.dk;
  float* red = qn + p.dk;
  const int64_t h = blockIdx.x, hk = h / (p.hv / p.hk), st = p.dk * p.dv;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  float* S = state_out + h * st;
  if (j < p.dv)
    for (int64_t i = 0; i < p.dk; ++i) S[i * p.dv + j] = state_in != nullptr ? state_in[h * st + i * p.dv + j] : 0.0f;
  for (int64_t t = 0; t < p.s; ++t) {
    load_norm(k + (t * p.hk + hk) * p.dk, p.dk, p.l2, p.eps, 1.0f, kn, nullptr, red);
    load_norm(q + (t * p.hk + hk) * p.dk, p.dk, p.l2, p.eps, p.scale, qn, nullptr, red);
    const float a = decay_of(g[t * p.hv + h]), b = beta[t * p.hv + h];
    if (j < p.dv) o[(t * p.hv + h) * p.dv + j] = column_forward(S + j, p.dv, kn, qn, p.dk, a, b, v[(t * p.hv + h) * p.dv + j]);
    __syncthreads();  // kn / qn are reloaded for the next token
  }
}

size_t bwd_smem_floats(const Shape& s) { return size_t(7 * s.dk + 6 * s.dv + kBwdThreads); }
size_t states_per_head(const Params& p) { return size_t(p.chunks + p.chunk + 1); }

__global__ void backward_kernel(Params p, const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ g,
                                const float* __restrict__ beta, const float* __restrict__ state_in,
                                const float* __restrict__ d_o, const float* __restrict__ d_state_out,
                                float* __restrict__ dv_out, float* __restrict__ dg, float* __restrict__ dbeta,
                                float* __restrict__ d_state_in, float* __restrict__ ws_states,
                                float* __restrict__ ws_dq, float* __restrict__ ws_dk) {
  extern __shared__ float sm[];
  const int64_t dk = p.dk, dv = p.dv, st = dk * dv;
  float* kraw = sm;
  float* qraw = kraw + dk;
  float* kn = qraw + dk;
  float* qn = kn + dk;
  float* dqh = qn + dk;
  float* dkh = dqh + dk;
  float* dgp = dkh + dk;
  float* vv = dgp + dk;
  float* dov = vv + dv;
  float* kvv = dov + dv;
  float* del = kvv + dv;
  float* dd = del + dv;
  float* dkv = dd + dv;
  float* red = dkv + dv;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t h = blockIdx.x, hk = h / (p.hv / p.hk);
  float* bnd = ws_states + h * int64_t(p.chunks + p.chunk + 1) * st;  // state entering chunk i
  float* cst = bnd + p.chunks * st;                                   // S_{t-1} of each token of a chunk
  float* ds = cst + p.chunk * st;                                     // dS, row-major [dk x dv]

  for (int64_t e = tid; e < st; e += nt) bnd[e] = state_in != nullptr ? state_in[h * st + e] : 0.0f;
  __syncthreads();
  for (int64_t i = 0; i + 1 < p.chunks; ++i) {
    block_copy(bnd + i * st, bnd + (i + 1) * st, st);
    for (int64_t t = i * p.chunk; t < (i + 1) * p.chunk; ++t) advance(p, h, hk, t, k, v, g, beta, bnd + (i + 1) * st, kn, red);
  }
  for (int64_t e = tid; e < st; e += nt) ds[e] = d_state_out != nullptr ? d_state_out[h * st + e] : 0.0f;
  __syncthreads();

  for (int64_t i = p.chunks - 1; i >= 0; --i) {
    const int64_t t0 = i * p.chunk, L = p.chunk < p.s - t0 ? p.chunk : p.s - t0;
    if (L <= 0) continue;  // s == 0 (uniform across the block)
    block_copy(bnd + i * st, cst, st);
    for (int64_t r = 0; r + 1 < L; ++r) {
      block_copy(cst + r * st, cst + (r + 1) * st, st);
      advance(p, h, hk, t0 + r, k, v, g, beta, cst + (r + 1) * st, kn, red);
    }
    for (int64_t r = L - 1; r >= 0; --r) {
      const int64_t t = t0 + r;
      const float inv_k = load_norm(k + (t * p.hk + hk) * dk, dk, p.l2, p.eps, 1.0f, kn, kraw, red);
      const float inv_q = load_norm(q + (t * p.hk + hk) * dk, dk, p.l2, p.eps, p.scale, qn, qraw, red);
      for (int64_t j = tid; j < dv; j += nt) {
        vv[j] = v[(t * p.hv + h) * dv + j];
        dov[j] = d_o[(t * p.hv + h) * dv + j];
      }
      const float a = decay_of(g[t * p.hv + h]), b = beta[t * p.hv + h];
      __syncthreads();
      const float* sp = cst + r * st;
      // Per column: kv, delta, dS += q do^T, dd = dS^T k, dv, dkv.
      for (int64_t j = tid; j < dv; j += nt) {
        float kv = 0.0f;
        for (int64_t x = 0; x < dk; ++x) kv += a * sp[x * dv + j] * kn[x];
        const float dl = delta_of(b, vv[j], kv);
        float ddj = 0.0f;
        for (int64_t x = 0; x < dk; ++x) {
          const float gs = ds[x * dv + j] + qn[x] * dov[j];
          ds[x * dv + j] = gs;
          ddj += gs * kn[x];
        }
        kvv[j] = kv;
        del[j] = dl;
        dd[j] = ddj;
        dkv[j] = -b * ddj;
        dv_out[(t * p.hv + h) * dv + j] = b * ddj;
      }
      __syncthreads();
      // Per row: dq = S_t do, dk = dS delta + S' dkv, and the row's share of dg = <S', dS + k dkv^T>.
      for (int64_t x = tid; x < dk; x += nt) {
        float aq = 0.0f, ak = 0.0f, ag = 0.0f;
        for (int64_t j = 0; j < dv; ++j) {
          const float sprev = sp[x * dv + j];
          aq += state_next(a, sprev, kn[x], del[j]) * dov[j];
          const float spp = a * sprev, gs = ds[x * dv + j];
          ak += gs * del[j] + spp * dkv[j];
          ag += spp * (gs + kn[x] * dkv[j]);
        }
        dqh[x] = aq;
        dkh[x] = ak;
        dgp[x] = ag;
      }
      __syncthreads();
      // Per element: dS_{t-1} = a (dS + k dkv^T).
      for (int64_t e = tid; e < st; e += nt) ds[e] = dstate_prev(a, ds[e], kn[e / dv], dkv[e % dv]);
      float pb = 0.0f, pg = 0.0f, pq = 0.0f, pk = 0.0f;
      for (int64_t j = tid; j < dv; j += nt) pb += dd[j] * (vv[j] - kvv[j]);
      for (int64_t x = tid; x < dk; x += nt) pg += dgp[x], pq += qraw[x] * dqh[x], pk += kraw[x] * dkh[x];
      const float dbeta_t = block_sum(pb, red), dg_t = block_sum(pg, red);
      const float xq = block_sum(pq, red), xk = block_sum(pk, red);
      if (tid == 0) {
        dg[t * p.hv + h] = dg_t;
        dbeta[t * p.hv + h] = dbeta_t;
      }
      for (int64_t x = tid; x < dk; x += nt) {
        ws_dq[(t * p.hv + h) * dk + x] = p.l2 ? p.scale * l2norm_grad(qraw[x], dqh[x], inv_q, xq) : p.scale * dqh[x];
        ws_dk[(t * p.hv + h) * dk + x] = p.l2 ? l2norm_grad(kraw[x], dkh[x], inv_k, xk) : dkh[x];
      }
      __syncthreads();
    }
  }
  if (d_state_in != nullptr)
    for (int64_t e = tid; e < st; e += nt) d_state_in[h * st + e] = ds[e];
}

// dq / dk of key head kh = the sum over its group of value heads (fixed order: deterministic).
__global__ void group_sum_kernel(Params p, const float* __restrict__ ws, float* __restrict__ out) {
  const int64_t n = p.s * p.hk * p.dk, group = p.hv / p.hk;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / (p.hk * p.dk), kh = (e / p.dk) % p.hk, x = e % p.dk;
    float acc = 0.0f;
    for (int64_t gi = 0; gi < group; ++gi) acc += ws[(t * p.hv + kh * group + gi) * p.dk + x];
    out[e] = acc;
  }
}

// ---- conv1d ----

__global__ void conv_forward_kernel(Conv c, const float* x, const float* hist, const float* w, const float* bias,
                                    float* y) {
  const int64_t n = c.s * c.channels;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const float z = conv_pre(x, hist, w, bias, e / c.channels, e % c.channels, c.channels, c.kernel);
    y[e] = c.silu ? silu(z) : z;
  }
}

__device__ float conv_dz(const Conv& c, const float* x, const float* hist, const float* w, const float* bias,
                         const float* dy, int64_t t, int64_t ch) {
  const float g = dy[t * c.channels + ch];
  return c.silu ? g * silu_grad(conv_pre(x, hist, w, bias, t, ch, c.channels, c.kernel)) : g;
}

// One thread per input element u in [-(K-1), S) (u < 0: history rows).
__global__ void conv_backward_input_kernel(Conv c, const float* x, const float* hist, const float* w, const float* bias,
                                           const float* dy, float* dx, float* d_hist) {
  const int64_t K = c.kernel, C = c.channels, n = (c.s + K - 1) * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / C - (K - 1), ch = e % C;
    float acc = 0.0f;
    for (int64_t kk = 0; kk < K; ++kk) {
      const int64_t row = u + (K - 1) - kk;
      if (row >= 0 && row < c.s) acc += w[ch * K + kk] * conv_dz(c, x, hist, w, bias, dy, row, ch);
    }
    if (u >= 0) dx[u * C + ch] = acc;
    else if (d_hist != nullptr) d_hist[(u + K - 1) * C + ch] = acc;
  }
}

// One thread per channel: d_weight[c][k] = sum_t dz[t][c] x_ext[t - (K-1) + k][c], d_bias[c] = sum_t dz[t][c].
__global__ void conv_backward_weight_kernel(Conv c, const float* x, const float* hist, const float* w,
                                            const float* bias, const float* dy, float* dw, float* db) {
  const int64_t K = c.kernel, C = c.channels;
  for (int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; ch < C; ch += int64_t(gridDim.x) * blockDim.x) {
    float accb = 0.0f;
    for (int64_t kk = 0; kk < K; ++kk) {
      float acc = 0.0f;
      for (int64_t t = 0; t < c.s; ++t) {
        const float dz = conv_dz(c, x, hist, w, bias, dy, t, ch);
        acc += dz * conv_input(x, hist, t - (K - 1) + kk, ch, C, K);
        if (kk == 0) accb += dz;
      }
      dw[ch * K + kk] = acc;
    }
    if (db != nullptr) db[ch] = accb;
  }
}

__global__ void conv_next_history_kernel(Conv c, const float* x, const float* hist, float* next) {
  const int64_t K = c.kernel, C = c.channels, n = (K - 1) * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    next[e] = conv_input(x, hist, c.s - (K - 1) + e / C, e % C, C, K);
}

}  // namespace

void forward(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
             const float* state_in, float* o, float* state_out, const Options& opt, cudaStream_t stream) {
  validate(s, opt);
  if (s.s > 0) need(q, "q"), need(k, "k"), need(v, "v"), need(g, "g"), need(beta, "beta"), need(o, "o");
  need(state_out, "state_out (required by the CUDA forward)");
  const size_t smem = size_t(2 * s.dk + kFwdThreads) * sizeof(float);
  allow_smem(forward_kernel, smem);
  const dim3 grid(static_cast<unsigned>(s.hv), static_cast<unsigned>((s.dv + kFwdThreads - 1) / kFwdThreads));
  forward_kernel<<<grid, kFwdThreads, smem, stream>>>(params(s, opt), q, k, v, g, beta, state_in, o, state_out);
  CUDA_CHECK(cudaGetLastError());
}

size_t backward_workspace_bytes(const Shape& s, const Options& opt) {
  validate(s, opt);
  const Params p = params(s, opt);
  return (size_t(s.hv) * states_per_head(p) * size_t(s.dk * s.dv) + 2 * size_t(s.s * s.hv * s.dk)) * sizeof(float);
}

void backward(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
              const float* state_in, const float* d_o, const float* d_state_out, float* dq, float* dk, float* dv,
              float* dg, float* dbeta, float* d_state_in, const Options& opt, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  validate(s, opt);
  if (s.s > 0) {
    need(q, "q"), need(k, "k"), need(v, "v"), need(g, "g"), need(beta, "beta"), need(d_o, "d_o");
    need(dq, "dq"), need(dk, "dk"), need(dv, "dv"), need(dg, "dg"), need(dbeta, "dbeta");
  }
  const size_t need_bytes = backward_workspace_bytes(s, opt);
  if (workspace == nullptr || workspace_bytes < need_bytes)
    throw std::invalid_argument("linear_attention: backward workspace (" + std::to_string(workspace_bytes) +
                                " bytes) must be non-null and hold at least " + std::to_string(need_bytes) + " bytes.");
  const Params p = params(s, opt);
  float* ws_states = static_cast<float*>(workspace);
  float* ws_dq = ws_states + size_t(s.hv) * states_per_head(p) * size_t(s.dk * s.dv);
  float* ws_dk = ws_dq + size_t(s.s * s.hv * s.dk);
  const size_t smem = bwd_smem_floats(s) * sizeof(float);
  allow_smem(backward_kernel, smem);
  backward_kernel<<<static_cast<unsigned>(s.hv), kBwdThreads, smem, stream>>>(
      p, q, k, v, g, beta, state_in, d_o, d_state_out, dv, dg, dbeta, d_state_in, ws_states, ws_dq, ws_dk);
  CUDA_CHECK(cudaGetLastError());
  if (s.s > 0) {
    group_sum_kernel<<<grid_1d(s.s * s.hk * s.dk), kThreads, 0, stream>>>(p, ws_dq, dq);
    CUDA_CHECK(cudaGetLastError());
    group_sum_kernel<<<grid_1d(s.s * s.hk * s.dk), kThreads, 0, stream>>>(p, ws_dk, dk);
    CUDA_CHECK(cudaGetLastError());
  }
}

void conv1d_forward(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                    float* y, cudaStream_t stream) {
  validate_conv(c);
  need(weight, "conv weight");
  if (c.s == 0) return;
  need(x, "conv input x"), need(y, "conv output y");
  conv_forward_kernel<<<grid_1d(c.s * c.channels), kThreads, 0, stream>>>(c, x, history, weight, bias, y);
  CUDA_CHECK(cudaGetLastError());
}

void conv1d_backward(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                     const float* dy, float* dx, float* d_history, float* d_weight, float* d_bias,
                     cudaStream_t stream) {
  validate_conv(c);
  need(weight, "conv weight"), need(d_weight, "conv d_weight");
  if (c.s > 0) need(x, "conv input x"), need(dy, "conv dy"), need(dx, "conv dx");
  conv_backward_input_kernel<<<grid_1d((c.s + c.kernel - 1) * c.channels), kThreads, 0, stream>>>(
      c, x, history, weight, bias, dy, dx, d_history);
  CUDA_CHECK(cudaGetLastError());
  conv_backward_weight_kernel<<<grid_1d(c.channels), kThreads, 0, stream>>>(c, x, history, weight, bias, dy, d_weight,
                                                                             d_bias);
  CUDA_CHECK(cudaGetLastError());
}

void conv1d_next_history(const Conv& c, const float* x, const float* history, float* next_history,
                         cudaStream_t stream) {
  validate_conv(c);
  if (c.kernel == 1) return;
  need(next_history, "conv next_history");
  if (c.s > 0) need(x, "conv input x");
  conv_next_history_kernel<<<grid_1d((c.kernel - 1) * c.channels), kThreads, 0, stream>>>(c, x, history, next_history);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace lcplan::linear_attention::cuda
