// Math of the gated delta rule and of the causal depthwise conv1d, shared verbatim by the CPU implementation and the
// CUDA kernels (C++17: the .cu includes it).
//
// Gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", arXiv 2412.06464), in the convention of HF
// transformers' torch_recurrent_gated_delta_rule (src/transformers/models/qwen3_next/modeling_qwen3_next.py):
// per value head, state S [dk x dv], for each token t with normalised k_t, q_t (q also scaled by 1/sqrt(dk)),
// a_t = exp(g_t), beta_t:
//   S'    = a_t S_{t-1}                      (last_recurrent_state * g_t.exp())
//   kv    = S'^T k_t                         (kv_mem)
//   delta = beta_t (v_t - kv)                (delta)
//   S_t   = S' + k_t delta^T                 i.e. S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T
//   o_t   = S_t^T q_t
// Every column j of the state evolves independently given k_t, q_t: column_forward() is one token on one column.
//
// Backward of one token, with dS the gradient of the loss w.r.t. S_t (accumulated from later tokens and dS_final):
//   dS    += q_t do_t^T                      dq_t  = S_t do_t
//   dd     = dS^T k_t                         dk_t += dS delta
//   dv_t   = beta_t dd                        dbeta_t = dd . (v_t - kv)
//   dkv    = -beta_t dd
//   dS'    = dS + k_t dkv^T                   dk_t += S' dkv
//   dg_t   = <S', dS'>  (= a_t <S_{t-1}, dS'>, the chain rule through a_t = exp(g_t))
//   dS_{t-1} = a_t dS'
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/hd.h"

namespace lcplan::linear_attention {

// ---- L2 normalisation (HF l2norm / FLA: x * rsqrt(sum x^2 + eps)) ----

LCPLAN_HD float l2norm_inv(const float* x, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / sqrtf(ss + eps);
}
LCPLAN_HD float l2norm_inv_from_sumsq(float ss, float eps) { return 1.0f / sqrtf(ss + eps); }
// d/dx of y = x * inv with inv = (sum x^2 + eps)^-1/2: dx_i = inv dy_i - inv^3 x_i (x . dy).
LCPLAN_HD float l2norm_grad(float x, float dy, float inv, float x_dot_dy) { return inv * dy - inv * inv * inv * x * x_dot_dy; }

// ---- per-element pieces of the recurrence ----

LCPLAN_HD float decay_of(float g) { return expf(g); }
LCPLAN_HD float delta_of(float beta, float v, float kv) { return beta * (v - kv); }
LCPLAN_HD float state_next(float a, float s_prev, float k, float delta) { return a * s_prev + k * delta; }
LCPLAN_HD float dstate_prev(float a, float ds, float k, float dkv) { return a * (ds + k * dkv); }

// One token on one state column (dk entries at s[i * stride]); returns o_j = S_t[:, j] . q (0 when q is null, e.g.
// while only the state is advanced).
LCPLAN_HD float column_forward(float* s, int64_t stride, const float* k, const float* q, int64_t dk, float a, float beta,
                               float v) {
  float kv = 0.0f;
  for (int64_t i = 0; i < dk; ++i) kv += a * s[i * stride] * k[i];
  const float delta = delta_of(beta, v, kv);
  float o = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    const float sn = state_next(a, s[i * stride], k[i], delta);
    s[i * stride] = sn;
    if (q != nullptr) o += sn * q[i];
  }
  return o;
}

// Backward of one token on one column j, given the column of S_{t-1} (s_prev) and of dS (ds, updated in place to
// the column of dS_{t-1}). Accumulates the column's share of dq_t, dk_t (w.r.t. the normalised, scaled q and the
// normalised k), dbeta_t and dg_t; writes dv_tj.
LCPLAN_HD void column_backward(const float* s_prev, float* ds, int64_t stride, const float* k, const float* q, int64_t dk,
                               float a, float beta, float v, float d_o, float* dq, float* dkey, float* dv,
                               float* dbeta, float* dg) {
  float kv = 0.0f;
  for (int64_t i = 0; i < dk; ++i) kv += a * s_prev[i * stride] * k[i];
  const float delta = delta_of(beta, v, kv);
  float dd = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    dq[i] += state_next(a, s_prev[i * stride], k[i], delta) * d_o;
    const float g = ds[i * stride] + q[i] * d_o;
    ds[i * stride] = g;
    dd += g * k[i];
    dkey[i] += g * delta;
  }
  *dv = beta * dd;
  *dbeta += dd * (v - kv);
  const float dkv = -beta * dd;
  float dgs = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    const float sp = a * s_prev[i * stride];
    dkey[i] += sp * dkv;
    dgs += sp * (ds[i * stride] + k[i] * dkv);
    ds[i * stride] = dstate_prev(a, ds[i * stride], k[i], dkv);
  }
  *dg += dgs;
}

// ---- chunked (WY / UT transform) form, HF torch_chunk_gated_delta_rule ----
// Within a chunk of L tokens with G_r = g_0 + ... + g_r (local cumulative log decay) and chunk-start state S:
//   A[r][j] = -beta_r exp(G_r - G_j) k_r . k_j   (j < r),   T = (I - A)^{-1} (unit lower triangular)
//   W = T diag(beta exp(G)) K,   U = T diag(beta) V,   u = U - W S       (u_r = the delta of token r)
//   O = diag(exp(G)) Q S + (tril(Q K^T) o exp(G_r - G_j)) u
//   S_next = exp(G_{L-1}) S + (diag(exp(G_{L-1} - G)) K)^T u

LCPLAN_HD float chunk_decay(float g_r, float g_j) { return expf(g_r - g_j); }
LCPLAN_HD float ut_entry(float beta_r, float g_r, float g_j, float kk) { return -beta_r * chunk_decay(g_r, g_j) * kk; }

// In place: a (L x L, row pitch ld) holds A strictly below the diagonal (the rest is ignored); on return it holds
// T = (I - A)^{-1}: T[i][j] = A[i][j] + sum_{j<m<i} A[i][m] T[m][j], ones on the diagonal, zeros above (HF's loop
// `attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)` followed by `+ eye`). Row i only reads original A
// entries of its own row at columns > j, so ascending j may overwrite in place.
LCPLAN_HD void ut_transform(float* a, int64_t L, int64_t ld) {
  for (int64_t i = 0; i < L; ++i) {
    float* row = a + i * ld;
    for (int64_t j = 0; j < i; ++j) {
      float t = row[j];
      for (int64_t m = j + 1; m < i; ++m) t += row[m] * a[m * ld + j];
      row[j] = t;
    }
    row[i] = 1.0f;
    for (int64_t j = i + 1; j < L; ++j) row[j] = 0.0f;
  }
}

// ---- causal depthwise conv1d (Qwen3-Next / Qwen3.5 linear-attention input conv, nn.Conv1d(groups=channels,
//      padding=K-1) truncated to the sequence, then SiLU) ----
// y[t][c] = act(bias[c] + sum_k w[c][k] * x_ext[t - (K-1) + k][c]), x_ext[u] = history[u + K-1] for u < 0.

LCPLAN_HD float conv_input(const float* x, const float* history, int64_t u, int64_t c, int64_t channels, int64_t kernel) {
  if (u >= 0) return x[u * channels + c];
  return history != nullptr ? history[(u + kernel - 1) * channels + c] : 0.0f;
}
LCPLAN_HD float conv_pre(const float* x, const float* history, const float* w, const float* bias, int64_t t, int64_t c,
                         int64_t channels, int64_t kernel) {
  float acc = bias != nullptr ? bias[c] : 0.0f;
  for (int64_t k = 0; k < kernel; ++k) acc += w[c * kernel + k] * conv_input(x, history, t - (kernel - 1) + k, c, channels, kernel);
  return acc;
}
LCPLAN_HD float silu(float z) { return z / (1.0f + expf(-z)); }
LCPLAN_HD float silu_grad(float z) {
  const float s = 1.0f / (1.0f + expf(-z));
  return s * (1.0f + z * (1.0f - s));
}

// ---- cost model (benchmarks and README), per token and value head ----
// Chunked forward: state terms W S, Q S and the state update (3 x 2 dk dv); intra-chunk terms A = K K^T and
// Q K^T (lower halves, C dk each), W = T (..) K (C dk), U = T (..) V and P u (C dv each); T by substitution (C^2 / 3).
constexpr double forward_flops_per_token(double dk, double dv, double c) {
  return 6.0 * dk * dv + 3.0 * c * dk + 2.0 * c * dv + c * c / 3.0;
}
// Backward as implemented: a chunked state-only pass for the chunk-boundary states (4 dk dv + 2 C dk + C dv + C^2/3),
// the per-token state recompute (6 dk dv, column_forward) and the reverse step (24 dk dv, column_backward).
constexpr double backward_flops_per_token(double dk, double dv, double c) {
  return 34.0 * dk * dv + 2.0 * c * dk + c * dv + c * c / 3.0;
}

}  // namespace lcplan::linear_attention
