// Per-element math of the executor's small ops, shared by the CPU ops (ops.cpp, layers.cpp, param_store.cpp) and
// their CUDA kernels (ops_cuda.cu): the same LCPLAN_HD code runs on both, so the CPU tests exercise what the device
// computes. Row reductions (sums of squares, the backward's dot products) are the caller's: the CPU sums in row
// order, a CUDA block in a tree; both in fp64, so the two differ by fp64 rounding only.
//
// RMSNorm (Zhang & Sennrich 2019, https://arxiv.org/abs/1910.07467): y = x / rms(x) * w, rms = sqrt(mean(x^2) + eps).
// Gated RMSNorm (HF Qwen3NextRMSNormGated): y = x / rms(x) * w * silu(z).
// Output gate (Qwen3.5 gated attention, https://arxiv.org/abs/2505.06708): y = o * sigmoid(gate).
// Gated DeltaNet gates (HF Qwen3-Next, transformers models/qwen3_next): decay g = -exp(A_log) softplus(a + dt_bias),
// beta = sigmoid(b).
// Adam (Kingma & Ba 2015, https://arxiv.org/abs/1412.6980) with bias correction, no weight decay.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/bf16.h"
#include "kernels/common/hd.h"

namespace lcplan::exec::math {

constexpr float kNormEps = 1e-6f;  // Qwen3-Next / Qwen3.5 rms_norm_eps

LCPLAN_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// 1 / rms from the row's fp64 sum of squares over h elements.
LCPLAN_HD double rms_rstd(double sumsq, int64_t h) { return 1.0 / sqrt(sumsq / double(h) + double(kNormEps)); }

// ---- Residual connection: the sum of two bf16-valued tensors, stored in bf16 ----
LCPLAN_HD float residual_y(float a, float b) { return round_bf16(a + b); }

// ---- RMSNorm ----
// Forward element with the fp32-rounded rstd.
LCPLAN_HD float rmsnorm_y(float x, float rstd, float w) { return x * rstd * w; }
// The backward's row dot product sums these: dxhat * xhat with dxhat = g w, xhat = x rstd.
LCPLAN_HD double rmsnorm_dot_term(float g, float w, float x, double rstd) { return double(g) * w * x * rstd; }
// dx = rstd (dxhat - xhat mean(dxhat xhat)), with `dot` that row mean.
LCPLAN_HD float rmsnorm_dx(float g, float w, float x, double rstd, double dot) {
  const double xhat = x * rstd, dxhat = double(g) * w;
  return float(rstd * (dxhat - xhat * dot));
}
// One row's term of dw = sum over rows of g xhat.
LCPLAN_HD float rmsnorm_dw_term(float g, float x, double rstd) { return float(g * (x * rstd)); }

// ---- Gated RMSNorm ----
LCPLAN_HD float gated_norm_y(float x, float rstd, float w, float z) { return x * rstd * w * (z * sigmoid(z)); }
LCPLAN_HD double gated_norm_dot_term(float g, float z, float w, float x, double rstd) {
  const float s = sigmoid(z);
  const double dxhat = double(g) * z * s * w;
  return dxhat * x * rstd;
}
struct GatedNormGrad {
  float dx = 0, dz = 0, dw_term = 0;
};
// d(x), d(z) and the row's dw term; `dot` is the row mean of gated_norm_dot_term.
LCPLAN_HD GatedNormGrad gated_norm_grad(float g_, float z, float w, float x, double rstd, double dot) {
  const float s = sigmoid(z);
  const double xhat = x * rstd, wi = w, g = g_;
  GatedNormGrad r;
  r.dz = float(g * xhat * wi * s * (1.0 + z * (1.0 - s)));  // d silu(z) / dz = s (1 + z (1 - s))
  r.dw_term = float(g * xhat * z * s);
  const double dxhat = g * z * s * wi;
  r.dx = float(rstd * (dxhat - xhat * dot));
  return r;
}

// ---- Sigmoid output gate (Qwen3.5 attention: o * sigmoid(gate) before o_proj) ----
LCPLAN_HD float output_gate_y(float o, float gate) { return o * sigmoid(gate); }
struct OutputGateGrad {
  float d_o = 0, d_gate = 0;
};
LCPLAN_HD OutputGateGrad output_gate_grad(float dy, float o, float gate) {
  const float s = sigmoid(gate);
  return {dy * s, dy * o * s * (1.0f - s)};
}

// ---- Gated DeltaNet gates ----
LCPLAN_HD float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
LCPLAN_HD float gdn_decay(float a, float a_log, float dt_bias) { return -expf(a_log) * softplus(a + dt_bias); }
// dg times d(decay)/da (= d(decay)/d(dt_bias)): softplus' derivative is the sigmoid.
LCPLAN_HD float gdn_decay_da(float dg, float a, float a_log, float dt_bias) {
  return dg * -expf(a_log) * sigmoid(a + dt_bias);
}
// dbeta times d(beta)/db.
LCPLAN_HD float gdn_beta_db(float dbeta, float beta) { return dbeta * beta * (1.0f - beta); }

// ---- Adam ----
struct AdamScalars {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double c1 = 1, c2 = 1;  // bias corrections 1 - beta1^step, 1 - beta2^step
};
inline AdamScalars adam_scalars(double lr, double beta1, double beta2, double eps, int step) {
  return {lr, beta1, beta2, eps, 1.0 - std::pow(beta1, step), 1.0 - std::pow(beta2, step)};
}
// One element: moments m, v and the fp32 master weight updated in place from the gradient g.
LCPLAN_HD void adam_update(float g, float& m, float& v, float& master, const AdamScalars& a) {
  m = float(a.beta1 * m + (1 - a.beta1) * g);
  v = float(a.beta2 * v + (1 - a.beta2) * double(g) * g);
  master = float(master - a.lr * (m / a.c1) / (sqrt(v / a.c2) + a.eps));
}

}  // namespace lcplan::exec::math
