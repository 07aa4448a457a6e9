#include "executor/ops_cuda.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common/cuda_check.h"
#include "kernels/moe/moe_kernels_cuda.h"

namespace lcplan::exec::cuda {

namespace {

constexpr int kThreads = 256;  // power of two: block_sum's tree halves it

unsigned elementwise_blocks(size_t n) {
  return unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, size_t(1) << 20));
}

void check_launch() { CUDA_CHECK(cudaGetLastError()); }

void check_workspace(const char* who, size_t have, size_t need) {
  if (have < need)
    throw std::invalid_argument(std::string(who) + ": workspace of " + std::to_string(have) + " bytes, needs " +
                                std::to_string(need));
}

// Sum over the block in a fixed tree (the same value for the same inputs and block size); every thread gets it.
__device__ double block_sum(double v) {
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();  // sh is reused by the next call
  return r;
}

__device__ double row_sumsq(const float* x, int64_t h) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < h; i += kThreads) s += double(x[i]) * x[i];
  return block_sum(s);
}

__global__ void round_kernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = round_bf16(x[i]);
}
__global__ void to_f32_kernel(const bf16* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = bf16_to_float(x[i]);
}

// One block per row. y may alias x: every read of the row happens before block_sum's barrier.
__global__ void rmsnorm_kernel(const float* x, const bf16* w, float* y, int64_t h) {
  const float* xr = x + int64_t(blockIdx.x) * h;
  const float rstd = float(math::rms_rstd(row_sumsq(xr, h), h));
  for (int64_t i = threadIdx.x; i < h; i += kThreads)
    y[int64_t(blockIdx.x) * h + i] = math::rmsnorm_y(xr[i], rstd, bf16_to_float(w[i]));
}

// Row statistics of the norm backwards: stats[2r] = rstd (fp64), stats[2r + 1] = the row mean of the dot terms.
__global__ void rmsnorm_stats_kernel(const float* x, const bf16* w, const float* dy, int64_t h, double* stats) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * h;
  const float* g = dy + r * h;
  const double rstd = math::rms_rstd(row_sumsq(xr, h), h);
  double dot = 0;
  for (int64_t i = threadIdx.x; i < h; i += kThreads) dot += math::rmsnorm_dot_term(g[i], bf16_to_float(w[i]), xr[i], rstd);
  dot = block_sum(dot) / double(h);
  if (threadIdx.x == 0) {
    stats[2 * r] = rstd;
    stats[2 * r + 1] = dot;
  }
}

// dw[i] += terms of every row, in row order (the CPU's order of float additions).
__global__ void rmsnorm_dw_kernel(const float* x, const float* dy, const double* stats, float* dw, int64_t rows,
                                  int64_t h) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= h) return;
  float acc = dw[i];
  for (int64_t r = 0; r < rows; ++r) acc += math::rmsnorm_dw_term(dy[r * h + i], x[r * h + i], stats[2 * r]);
  dw[i] = acc;
}

// dx may alias dy: each element is read and written by the same thread.
__global__ void rmsnorm_dx_kernel(const float* x, const bf16* w, const float* dy, float* dx, const double* stats,
                                  int64_t rows, int64_t h, bool accumulate) {
  const size_t n = size_t(rows * h);
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x) {
    const int64_t r = int64_t(e) / h, i = int64_t(e) % h;
    const float v = math::rmsnorm_dx(dy[e], bf16_to_float(w[i]), x[e], stats[2 * r], stats[2 * r + 1]);
    dx[e] = accumulate ? dx[e] + v : v;
  }
}

__global__ void gated_norm_kernel(const float* x, const float* z, const bf16* w, float* y, int64_t dv) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dv;
  const float rstd = float(math::rms_rstd(row_sumsq(xr, dv), dv));
  for (int64_t i = threadIdx.x; i < dv; i += kThreads)
    y[r * dv + i] = math::gated_norm_y(xr[i], rstd, bf16_to_float(w[i]), z[r * dv + i]);
}

__global__ void gated_norm_stats_kernel(const float* x, const float* z, const bf16* w, const float* dy, int64_t dv,
                                        double* stats) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dv;
  const double rstd = math::rms_rstd(row_sumsq(xr, dv), dv);
  double dot = 0;
  for (int64_t i = threadIdx.x; i < dv; i += kThreads)
    dot += math::gated_norm_dot_term(dy[r * dv + i], z[r * dv + i], bf16_to_float(w[i]), xr[i], rstd);
  dot = block_sum(dot) / double(dv);
  if (threadIdx.x == 0) {
    stats[2 * r] = rstd;
    stats[2 * r + 1] = dot;
  }
}

__global__ void gated_norm_dw_kernel(const float* x, const float* z, const bf16* w, const float* dy,
                                     const double* stats, float* dw, int64_t rows, int64_t dv) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= dv) return;
  float acc = dw[i];
  for (int64_t r = 0; r < rows; ++r) {
    const size_t e = size_t(r * dv + i);
    acc += math::gated_norm_grad(dy[e], z[e], bf16_to_float(w[i]), x[e], stats[2 * r], stats[2 * r + 1]).dw_term;
  }
  dw[i] = acc;
}

__global__ void gated_norm_dx_kernel(const float* x, const float* z, const bf16* w, const float* dy, float* dx,
                                     float* dz, const double* stats, int64_t rows, int64_t dv) {
  const size_t n = size_t(rows * dv);
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x) {
    const int64_t r = int64_t(e) / dv, i = int64_t(e) % dv;
    const math::GatedNormGrad gr =
        math::gated_norm_grad(dy[e], z[e], bf16_to_float(w[i]), x[e], stats[2 * r], stats[2 * r + 1]);
    dz[e] = gr.dz;
    dx[e] = gr.dx;
  }
}

// Gated DeltaNet gates: one thread per (row, head) element; the backward's per-head sums one thread per head over the
// rows in order (the CPU's order of additions, no atomics).
__global__ void gdn_gates_kernel(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log,
                                 const bf16* dt_bias, int64_t T, int64_t lv, float* gb) {
  const size_t n = size_t(T * lv);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t t = int64_t(i) / lv, h = int64_t(i) % lv;
    gb[t * 2 * lv + h] = math::gdn_decay(proj[t * P + acol + h], bf16_to_float(a_log[h]), bf16_to_float(dt_bias[h]));
    gb[t * 2 * lv + lv + h] = math::sigmoid(proj[t * P + bcol + h]);
  }
}

__global__ void gdn_gates_dproj_kernel(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log,
                                       const bf16* dt_bias, const float* gb, const float* dg, const float* dbeta,
                                       int64_t r0, int64_t rows, int64_t lv, float* dproj) {
  const size_t n = size_t(rows * lv);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t t = int64_t(i) / lv, h = int64_t(i) % lv, row = r0 + t;
    dproj[row * P + acol + h] =
        math::gdn_decay_da(dg[i], proj[row * P + acol + h], bf16_to_float(a_log[h]), bf16_to_float(dt_bias[h]));
    dproj[row * P + bcol + h] = math::gdn_beta_db(dbeta[i], gb[row * 2 * lv + lv + h]);
  }
}

__global__ void gdn_gates_dw_kernel(const float* proj, int64_t P, int64_t acol, const bf16* a_log,
                                    const bf16* dt_bias, const float* gb, const float* dg, int64_t r0, int64_t rows,
                                    int64_t lv, float* d_dt_bias, float* d_a_log) {
  const int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (h >= lv) return;
  const float alog = bf16_to_float(a_log[h]), dt = bf16_to_float(dt_bias[h]);
  float sdt = d_dt_bias[h], salog = d_a_log[h];
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t row = r0 + t;
    const float dgv = dg[t * lv + h];
    sdt += math::gdn_decay_da(dgv, proj[row * P + acol + h], alog, dt);
    salog += dgv * gb[row * 2 * lv + h];
  }
  d_dt_bias[h] = sdt;
  d_a_log[h] = salog;
}

__global__ void add_bias_kernel(float* y, const bf16* b, int64_t rows, int64_t n) {
  const size_t total = size_t(rows) * size_t(n);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
    y[i] += bf16_to_float(b[i % size_t(n)]);
}

__global__ void bias_bwd_kernel(const float* dy, int64_t rows, int64_t n, float* db) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
    float s = 0;
    for (int64_t r = 0; r < rows; ++r) s += dy[r * n + j];
    db[j] += s;
  }
}

__global__ void output_gate_kernel(const float* o, const float* gate, float* go, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    go[i] = round_bf16(math::output_gate_y(o[i], gate[i]));
}

__global__ void output_gate_bwd_kernel(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate,
                                       size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const math::OutputGateGrad g = math::output_gate_grad(dgo[i], o[i], gate[i]);
    d_o[i] = g.d_o;
    d_gate[i] = g.d_gate;
  }
}

__global__ void embedding_rows_kernel(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0,
                                      int64_t Vl, float* out) {
  const size_t n = size_t(T * h);
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x) {
    const int64_t t = int64_t(e) / h, j = int64_t(e) % h, tok = tokens[t];
    out[e] = tok >= V0 && tok < V0 + Vl ? bf16_to_float(table[(tok - V0) * h + j]) : 0.0f;
  }
}

__global__ void embedding_rows_bwd_kernel(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0,
                                          int64_t Vl, float* g) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= h) return;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = tokens[t];
    if (tok >= V0 && tok < V0 + Vl) g[(tok - V0) * h + j] += dy[t * h + j];
  }
}

__global__ void adam_kernel(const float* g, float* m, float* v, float* master, bf16* p, size_t n,
                            math::AdamScalars a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i], wi = master[i];
    math::adam_update(g[i], mi, vi, wi, a);
    m[i] = mi;
    v[i] = vi;
    master[i] = wi;
    if (p) p[i] = float_to_bf16(wi);
  }
}

__global__ void add_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void residual_kernel(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = math::residual_y(a[i], b[i]);
}

// Launched with one block of kThreads.
__global__ void sum_squares_kernel(const float* x, size_t n, double* out) {
  double s = 0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) s += double(x[i]) * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

void check_rows(const char* who, int64_t rows) {
  if (rows > int64_t(INT32_MAX))
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(rows) +
                                " rows exceed the grid's 2^31 - 1 blocks (one block per row)");
}

// A width the MoE kernels take as int.
int checked_int(const char* who, int64_t f) {
  if (f > int64_t(INT32_MAX))
    throw std::invalid_argument(std::string(who) + ": width " + std::to_string(f) + " exceeds 2^31 - 1");
  return int(f);
}

}  // namespace

void round_bf16_inplace(float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, n);
  check_launch();
}
// The MoE kernels' cast (round to nearest even, as float_to_bf16; lcplan::bf16 is layout-compatible with CUDA's).
void to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream) {
  moe::gpu::launch_cast(x, int64_t(n), reinterpret_cast<moe::gpu::bf16*>(y), stream);
}
void to_f32(const bf16* x, float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_f32_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, y, n);
  check_launch();
}

void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  check_rows("rmsnorm", rows);
  rmsnorm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, w, y, h);
  check_launch();
}

size_t norm_bwd_workspace_bytes(int64_t rows) { return size_t(rows) * 2 * sizeof(double); }

void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                 bool accumulate_dx, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  check_rows("rmsnorm_bwd", rows);
  check_workspace("rmsnorm_bwd", workspace_bytes, norm_bwd_workspace_bytes(rows));
  double* stats = static_cast<double*>(workspace);
  rmsnorm_stats_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, w, dy, h, stats);
  check_launch();
  // dw before dx: dx may overwrite dy.
  if (dw) {
    rmsnorm_dw_kernel<<<unsigned((h + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, dy, stats, dw, rows, h);
    check_launch();
  }
  rmsnorm_dx_kernel<<<elementwise_blocks(size_t(rows * h)), kThreads, 0, stream>>>(x, w, dy, dx, stats, rows, h,
                                                                                   accumulate_dx);
  check_launch();
}

void gated_norm(const float* x, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv,
                cudaStream_t stream) {
  const int64_t n = rows * heads;
  if (n == 0 || dv == 0) return;
  check_rows("gated_norm", n);
  gated_norm_kernel<<<unsigned(n), kThreads, 0, stream>>>(x, z, w, y, dv);
  check_launch();
}

void gated_norm_bwd(const float* x, const float* z, const bf16* w, const float* dy, float* dx, float* dz, float* dw,
                    int64_t rows, int64_t heads, int64_t dv, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream) {
  const int64_t n = rows * heads;
  if (n == 0 || dv == 0) return;
  check_rows("gated_norm_bwd", n);
  check_workspace("gated_norm_bwd", workspace_bytes, norm_bwd_workspace_bytes(n));
  double* stats = static_cast<double*>(workspace);
  gated_norm_stats_kernel<<<unsigned(n), kThreads, 0, stream>>>(x, z, w, dy, dv, stats);
  check_launch();
  gated_norm_dw_kernel<<<unsigned((dv + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, z, w, dy, stats, dw, n,
                                                                                         dv);
  check_launch();
  gated_norm_dx_kernel<<<elementwise_blocks(size_t(n * dv)), kThreads, 0, stream>>>(x, z, w, dy, dx, dz, stats, n, dv);
  check_launch();
}

void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
               int64_t T, int64_t lv, float* gb, cudaStream_t stream) {
  if (T == 0 || lv == 0) return;
  gdn_gates_kernel<<<elementwise_blocks(size_t(T * lv)), kThreads, 0, stream>>>(proj, P, acol, bcol, a_log, dt_bias, T,
                                                                                lv, gb);
  check_launch();
}

void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                   const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                   float* dproj, float* d_dt_bias, float* d_a_log, cudaStream_t stream) {
  if (n == 0 || lv == 0) return;
  gdn_gates_dproj_kernel<<<elementwise_blocks(size_t(n * lv)), kThreads, 0, stream>>>(
      proj, P, acol, bcol, a_log, dt_bias, gb, dg, dbeta, r0, n, lv, dproj);
  check_launch();
  gdn_gates_dw_kernel<<<unsigned((lv + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      proj, P, acol, a_log, dt_bias, gb, dg, r0, n, lv, d_dt_bias, d_a_log);
  check_launch();
}

void output_gate(const float* o, const float* gate, float* go, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  output_gate_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(o, gate, go, n);
  check_launch();
}

void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  output_gate_bwd_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(dgo, o, gate, d_o, d_gate, n);
  check_launch();
}

void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl, float* out,
                    cudaStream_t stream) {
  if (T == 0 || h == 0) return;
  embedding_rows_kernel<<<elementwise_blocks(size_t(T * h)), kThreads, 0, stream>>>(table, tokens, T, h, V0, Vl, out);
  check_launch();
}

void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                        float* g, cudaStream_t stream) {
  if (T == 0 || h == 0) return;
  embedding_rows_bwd_kernel<<<unsigned((h + kThreads - 1) / kThreads), kThreads, 0, stream>>>(tokens, dy, T, h, V0, Vl,
                                                                                             g);
  check_launch();
}

// SwiGLU is the MoE kernels' (same [gate | up] layout, same moe_math.h element).
void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f, cudaStream_t stream) {
  moe::gpu::launch_swiglu(h1, rows, checked_int("swiglu_fwd", f), act, stream);
}

void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f, cudaStream_t stream) {
  moe::gpu::launch_swiglu_bwd(h1, dact, rows, checked_int("swiglu_back", f), dh1, stream);
}

void adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n, const math::AdamScalars& a,
          cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(g, m, v, master, p, n, a);
  check_launch();
}

void add_bias(float* y, const bf16* b, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  add_bias_kernel<<<elementwise_blocks(size_t(rows) * size_t(n)), kThreads, 0, stream>>>(y, b, rows, n);
  check_launch();
}

void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db, cudaStream_t stream) {
  if (n == 0) return;
  bias_bwd_kernel<<<elementwise_blocks(size_t(n)), kThreads, 0, stream>>>(dy, rows, n, db);
  check_launch();
}

void add_inplace(const float* x, float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(x, y, n);
  check_launch();
}

void residual(const float* a, const float* b, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(a, b, out, n);
  check_launch();
}

void sum_squares(const float* x, size_t n, double* out, cudaStream_t stream) {
  sum_squares_kernel<<<1, kThreads, 0, stream>>>(x, n, out);
  check_launch();
}

size_t matmul_workspace_bytes(int64_t k, int64_t n) { return size_t(k * n) * sizeof(float); }

void matmul(cublasHandle_t handle, const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n,
            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  check_workspace("matmul", workspace_bytes, matmul_workspace_bytes(k, n));
  float* wf = static_cast<float*>(workspace);
  to_f32(W, wf, size_t(k * n), stream);
  if (k == 0) {  // an empty inner dimension: y = 0 (cuBLAS refuses k = 0 with beta = 0)
    CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(rows * n) * sizeof(float), stream));
    return;
  }
  moe::gpu::gemm(handle, false, false, rows, n, k, x, wf, y, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, true, stream);
}

void matmul_bwd(cublasHandle_t handle, const float* x, const bf16* W, const float* dy, float* dx, float* dW,
                int64_t rows, int64_t k, int64_t n, bool accumulate_dx, void* workspace, size_t workspace_bytes,
                cudaStream_t stream) {
  if (rows == 0) return;
  if (dx) {
    if (n == 0) {
      if (!accumulate_dx) CUDA_CHECK(cudaMemsetAsync(dx, 0, size_t(rows * k) * sizeof(float), stream));
    } else {
      check_workspace("matmul_bwd", workspace_bytes, matmul_workspace_bytes(k, n));
      float* wf = static_cast<float*>(workspace);
      to_f32(W, wf, size_t(k * n), stream);
      // dx[rows x k] = dy[rows x n] W^T (W stored k x n: trans_b).
      moe::gpu::gemm(handle, false, true, rows, k, n, dy, wf, dx, CUDA_R_32F, CUDA_R_32F, 1.0f,
                     accumulate_dx ? 1.0f : 0.0f, true, stream);
    }
  }
  // dW[k x n] += x^T dy (x stored rows x k: trans_a).
  if (dW) moe::gpu::gemm(handle, true, false, k, n, rows, x, dy, dW, CUDA_R_32F, CUDA_R_32F, 1.0f, 1.0f, true, stream);
}

}  // namespace lcplan::exec::cuda
