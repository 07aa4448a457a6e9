#include "executor/ops.h"

#include <cmath>

#include <Eigen/Core>

#include "executor/ops_math.h"
#include "kernels/moe/moe_math.h"

namespace lcplan::exec {

void add_bias(float* y, const bf16* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += bf16_to_float(b[j]);
}

void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db) {
  for (int64_t j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t r = 0; r < rows; ++r) s += dy[r * n + j];
    db[j] += s;
  }
}

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

namespace {

using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapD = Eigen::Map<RowMatD>;

// fp64 operands of a GEMM in workspace (the GEMM's own copies, like a GPU GEMM's staged tiles).
Buf<double> wide64(Tracker& t, const float* x, size_t n) {
  Buf<double> b(t, Category::Workspace, n);
  for (size_t i = 0; i < n; ++i) b[i] = x[i];
  return b;
}
Buf<double> wide64(Tracker& t, const bf16* x, size_t n) {
  Buf<double> b(t, Category::Workspace, n);
  for (size_t i = 0; i < n; ++i) b[i] = bf16_to_float(x[i]);
  return b;
}

}  // namespace

void matmul64(Tracker& t, const float* x, const bf16* W, double* y, int64_t rows, int64_t k, int64_t n) {
  if (rows == 0 || n == 0) return;
  Buf<double> xd = wide64(t, x, size_t(rows * k)), wd = wide64(t, W, size_t(k * n));
  MapD(y, rows, n).noalias() = MapD(xd.data(), rows, k) * MapD(wd.data(), k, n);
}

void matmul(Tracker& t, const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n) {
  if (rows == 0 || n == 0) return;
  Buf<double> yd(t, Category::Workspace, size_t(rows * n));
  matmul64(t, x, W, yd.data(), rows, k, n);
  for (size_t i = 0; i < yd.size(); ++i) y[i] = float(yd[i]);
}

void matmul_bwd64(Tracker& t, const float* x, const bf16* W, const float* dy, double* dx, float* dW, int64_t rows,
                  int64_t k, int64_t n) {
  if (rows == 0) return;
  Buf<double> dyd = wide64(t, dy, size_t(rows * n));
  if (dx) {
    Buf<double> wd = wide64(t, W, size_t(k * n));
    MapD(dx, rows, k).noalias() = MapD(dyd.data(), rows, n) * MapD(wd.data(), k, n).transpose();
  }
  if (dW) {
    Buf<double> xd = wide64(t, x, size_t(rows * k)), dwd(t, Category::Workspace, size_t(k * n));
    MapD(dwd.data(), k, n).noalias() = MapD(xd.data(), rows, k).transpose() * MapD(dyd.data(), rows, n);
    for (size_t i = 0; i < dwd.size(); ++i) dW[i] += float(dwd[i]);
  }
}

void matmul_bwd(Tracker& t, const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows,
                int64_t k, int64_t n, bool accumulate_dx) {
  if (rows == 0) return;
  Buf<double> dxd(t, Category::Workspace, dx ? size_t(rows * k) : 0);
  matmul_bwd64(t, x, W, dy, dx ? dxd.data() : nullptr, dW, rows, k, n);
  if (dx)
    for (size_t i = 0; i < dxd.size(); ++i) dx[i] = accumulate_dx ? dx[i] + float(dxd[i]) : float(dxd[i]);
}

void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(xr[i]) * xr[i];
    const float rstd = float(math::rms_rstd(ss, h));
    for (int64_t i = 0; i < h; ++i) y[r * h + i] = math::rmsnorm_y(xr[i], rstd, bf16_to_float(w[i]));
  }
}

void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                 bool accumulate_dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* g = dy + r * h;
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(xr[i]) * xr[i];
    const double rstd = math::rms_rstd(ss, h);
    double dot = 0;  // mean(dxhat * xhat)
    for (int64_t i = 0; i < h; ++i) dot += math::rmsnorm_dot_term(g[i], bf16_to_float(w[i]), xr[i], rstd);
    dot /= double(h);
    for (int64_t i = 0; i < h; ++i) {
      if (dw) dw[i] += math::rmsnorm_dw_term(g[i], xr[i], rstd);
      const float v = math::rmsnorm_dx(g[i], bf16_to_float(w[i]), xr[i], rstd, dot);
      if (accumulate_dx) dx[r * h + i] += v;
      else dx[r * h + i] = v;
    }
  }
}

void gated_norm(const float* o, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv) {
  for (int64_t r = 0; r < rows * heads; ++r) {
    const float* x = o + r * dv;
    double ss = 0;
    for (int64_t i = 0; i < dv; ++i) ss += double(x[i]) * x[i];
    const float rstd = float(math::rms_rstd(ss, dv));
    for (int64_t i = 0; i < dv; ++i) y[r * dv + i] = math::gated_norm_y(x[i], rstd, bf16_to_float(w[i]), z[r * dv + i]);
  }
}

void gated_norm_bwd(const float* o, const float* z, const bf16* w, const float* dy, float* dO, float* dz, float* dw,
                    int64_t rows, int64_t heads, int64_t dv) {
  for (int64_t r = 0; r < rows * heads; ++r) {
    const float* x = o + r * dv;
    double ss = 0;
    for (int64_t i = 0; i < dv; ++i) ss += double(x[i]) * x[i];
    const double rstd = math::rms_rstd(ss, dv);
    double dot = 0;
    for (int64_t i = 0; i < dv; ++i)
      dot += math::gated_norm_dot_term(dy[r * dv + i], z[r * dv + i], bf16_to_float(w[i]), x[i], rstd);
    dot /= double(dv);
    for (int64_t i = 0; i < dv; ++i) {
      const math::GatedNormGrad gr =
          math::gated_norm_grad(dy[r * dv + i], z[r * dv + i], bf16_to_float(w[i]), x[i], rstd, dot);
      dz[r * dv + i] = gr.dz;
      dw[i] += gr.dw_term;
      dO[r * dv + i] = gr.dx;
    }
  }
}

void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
               int64_t T, int64_t lv, float* gb) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < lv; ++h) {
      gb[t * 2 * lv + h] = math::gdn_decay(proj[t * P + acol + h], bf16_to_float(a_log[h]), bf16_to_float(dt_bias[h]));
      gb[t * 2 * lv + lv + h] = math::sigmoid(proj[t * P + bcol + h]);
    }
}

void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                   const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                   float* dproj, float* d_dt_bias, float* d_a_log) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < lv; ++h) {
      const int64_t row = r0 + t;
      const float alog = bf16_to_float(a_log[h]), dgv = dg[t * lv + h];
      const float da = math::gdn_decay_da(dgv, proj[row * P + acol + h], alog, bf16_to_float(dt_bias[h]));
      dproj[row * P + acol + h] = da;
      d_dt_bias[h] += da;
      d_a_log[h] += dgv * gb[row * 2 * lv + h];
      dproj[row * P + bcol + h] = math::gdn_beta_db(dbeta[t * lv + h], gb[row * 2 * lv + lv + h]);
    }
}

void output_gate(const float* o, const float* gate, float* go, size_t n) {
  for (size_t i = 0; i < n; ++i) go[i] = round_bf16(math::output_gate_y(o[i], gate[i]));
}

void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const math::OutputGateGrad g = math::output_gate_grad(dgo[i], o[i], gate[i]);
    d_o[i] = g.d_o;
    d_gate[i] = g.d_gate;
  }
}

void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                    float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const bool mine = tokens[t] >= V0 && tokens[t] < V0 + Vl;
    for (int64_t j = 0; j < h; ++j) out[t * h + j] = mine ? bf16_to_float(table[(tokens[t] - V0) * h + j]) : 0.0f;
  }
}

void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                        float* g) {
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] >= V0 && tokens[t] < V0 + Vl)
      for (int64_t j = 0; j < h; ++j) g[(tokens[t] - V0) * h + j] += dy[t * h + j];
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
