#include "executor/ops.h"

#include <cmath>

#include <Eigen/Core>

#include "kernels/moe/moe_math.h"

namespace lcplan::exec {

namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMat>;
using CMap = Eigen::Map<const RowMat>;
}  // namespace

void round_bf16_inplace(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}
void to_bf16(const float* x, bf16* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}
void to_f32(const bf16* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

Buf<float> widen(Tracker& t, const bf16* x, size_t n) {
  Buf<float> b(t, Category::Workspace, n);
  to_f32(x, b.data(), n);
  return b;
}

void matmul(Tracker& t, const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n) {
  if (rows == 0 || n == 0) return;
  Buf<float> w = widen(t, W, size_t(k * n));
  Map(y, rows, n).noalias() = CMap(x, rows, k) * CMap(w.data(), k, n);
}

void matmul_bwd(Tracker& t, const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows,
                int64_t k, int64_t n, bool accumulate_dx) {
  if (rows == 0) return;
  Buf<float> w = widen(t, W, size_t(k * n));
  if (dx) {
    if (accumulate_dx) Map(dx, rows, k).noalias() += CMap(dy, rows, n) * CMap(w.data(), k, n).transpose();
    else Map(dx, rows, k).noalias() = CMap(dy, rows, n) * CMap(w.data(), k, n).transpose();
  }
  if (dW) Map(dW, k, n).noalias() += CMap(x, rows, k).transpose() * CMap(dy, rows, n);
}

void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(xr[i]) * xr[i];
    const float rstd = float(1.0 / std::sqrt(ss / double(h) + kNormEps));
    for (int64_t i = 0; i < h; ++i) y[r * h + i] = xr[i] * rstd * bf16_to_float(w[i]);
  }
}

void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                 bool accumulate_dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* g = dy + r * h;
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(xr[i]) * xr[i];
    const double rstd = 1.0 / std::sqrt(ss / double(h) + kNormEps);
    double dot = 0;  // mean(dxhat * xhat)
    for (int64_t i = 0; i < h; ++i) dot += double(g[i]) * bf16_to_float(w[i]) * xr[i] * rstd;
    dot /= double(h);
    for (int64_t i = 0; i < h; ++i) {
      const double xhat = xr[i] * rstd;
      const double dxhat = double(g[i]) * bf16_to_float(w[i]);
      if (dw) dw[i] += float(g[i] * xhat);
      const float v = float(rstd * (dxhat - xhat * dot));
      if (accumulate_dx) dx[r * h + i] += v;
      else dx[r * h + i] = v;
    }
  }
}

void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j) act[r * f + j] = moe::swiglu(h1[r * 2 * f + j], h1[r * 2 * f + f + j]);
}

void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < f; ++j)
      moe::swiglu_bwd(h1[r * 2 * f + j], h1[r * 2 * f + f + j], dact[r * f + j], &dh1[r * 2 * f + j],
                      &dh1[r * 2 * f + f + j]);
}

}  // namespace lcplan::exec
