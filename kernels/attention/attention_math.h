// Tile math of softmax attention and RoPE, shared verbatim by the CPU implementation and the CUDA kernels (C++17:
// the .cu includes it).
//
// Per query row i (position q_start + i) and visible key j (position k_start + j), s_ij = scale * q_i . k_j.
//   forward : online softmax over key tiles (FlashAttention-2, arXiv 2307.08691, Algorithm 1): a running max m_i and
//             sum l_i; each tile rescales the row's accumulator by exp(m_old - m_new). o_i = acc_i / l_i and
//             lse_i = m_i + log l_i (natural log), the only statistic the backward needs.
//   backward: p_ij = exp(s_ij - lse_i) recomputed per tile, D_i = rowsum(do_i * o_i),
//             ds_ij = p_ij (dp_ij - D_i) with dp_ij = do_i . v_j (FlashAttention-2, Algorithm 2).
// A row with no visible key has l_i = 0: o_i = 0, lse_i = -inf, and every p_ij = 0, so its gradients are exactly 0.
//
// Visibility is by absolute positions (so context-parallel chunks can be computed independently): a key is hidden
// when causal and key_pos > query_pos, or when window > 0 and query_pos - key_pos >= window. For a fixed query the
// visible keys form one contiguous index range, and both ends of that range grow with the query position.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/hd.h"

namespace lcplan::attention {

LCPLAN_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
LCPLAN_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

LCPLAN_HD bool key_visible(int64_t qpos, int64_t kpos, bool causal, int64_t window) {
  if (causal && kpos > qpos) return false;
  if (window > 0 && qpos - kpos >= window) return false;
  return true;
}

// Keys k_start .. k_start + sk - 1 visible from query position qpos: the index range [*lo, *hi) (empty: lo == hi).
LCPLAN_HD void visible_key_range(int64_t qpos, int64_t k_start, int64_t sk, bool causal, int64_t window, int64_t* lo,
                                 int64_t* hi) {
  int64_t l = 0, h = sk;
  if (causal) h = imin(h, qpos - k_start + 1);
  if (window > 0) l = imax(l, qpos - window + 1 - k_start);
  l = imin(l, sk);
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

// Queries q_start .. q_start + sq - 1 that see at least one key position in [kpos_first, kpos_last]: [*lo, *hi).
LCPLAN_HD void visible_query_range(int64_t kpos_first, int64_t kpos_last, int64_t q_start, int64_t sq, bool causal,
                                   int64_t window, int64_t* lo, int64_t* hi) {
  int64_t l = 0, h = sq;
  if (causal) l = imax(l, kpos_first - q_start);              // query_pos >= key_pos for some key in the tile
  if (window > 0) h = imin(h, kpos_last + window - q_start);  // query_pos - key_pos < window for some key
  l = imin(l, sq);
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

// Sets the scores of hidden keys in one row of n scores (key positions kpos0 .. kpos0 + n - 1) to -inf.
LCPLAN_HD void mask_row(float* s, int64_t n, int64_t qpos, int64_t kpos0, bool causal, int64_t window) {
  int64_t lo = 0, hi = 0;
  visible_key_range(qpos, kpos0, n, causal, window, &lo, &hi);
  for (int64_t j = 0; j < lo; ++j) s[j] = -INFINITY;
  for (int64_t j = hi; j < n; ++j) s[j] = -INFINITY;
}

// Folds one row of n scores (hidden ones -inf) into the running (m, l): overwrites the scores with
// p = exp(s - m_new) and returns exp(m_old - m_new), the factor the row's output accumulator must be scaled by
// before p @ V is added. Never exponentiates a positive number.
LCPLAN_HD float online_softmax_row(float* s, int64_t n, float* m, float* l) {
  float mt = *m;
  for (int64_t j = 0; j < n; ++j) mt = fmaxf(mt, s[j]);
  if (mt == -INFINITY) {  // nothing visible so far: the accumulator is 0, keep it
    for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
    return 1.0f;
  }
  const float alpha = *m == -INFINITY ? 0.0f : expf(*m - mt);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float p = s[j] == -INFINITY ? 0.0f : expf(s[j] - mt);
    s[j] = p;
    sum += p;
  }
  *l = *l * alpha + sum;
  *m = mt;
  return alpha;
}

// Row statistics at the end of the key loop: lse = m + log l, and 1 / l for the output (0 for an empty row).
LCPLAN_HD float final_lse(float m, float l) { return l > 0.0f ? m + logf(l) : -INFINITY; }
LCPLAN_HD float final_inv_l(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// Backward: the probability of a (masked: -inf) score given the row's lse; 0 for an empty row (lse = -inf).
LCPLAN_HD float prob_from_lse(float s, float lse) {
  return (s == -INFINITY || lse == -INFINITY) ? 0.0f : expf(s - lse);
}
// d score = p (dp - D), D = rowsum(do * o).
LCPLAN_HD float dscore(float p, float dp, float d_row) { return p * (dp - d_row); }

// log(exp(a) + exp(b)) without overflow; -inf is the identity.
LCPLAN_HD float lse_add(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const float m = fmaxf(a, b);
  return m + log1pf(expf(-fabsf(a - b)));
}
// Weight of a partial result with log-sum-exp lse_part in the merged one (lse_total): exp(lse_part - lse_total).
LCPLAN_HD float merge_weight(float lse_part, float lse_total) {
  return lse_part == -INFINITY ? 0.0f : expf(lse_part - lse_total);
}

// ---- RoPE (rotate_half convention of HF transformers' Llama / Qwen: dims i and i + rotary_dim/2 form a pair) ----

// inv_freq_i = 1 / theta^(2i / rotary_dim), computed in fp32 as HF's RotaryEmbedding does.
LCPLAN_HD float rope_inv_freq(int64_t i, int64_t rotary_dim, float theta) {
  return 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
}
// cos and sin of pos * inv_freq. The angle is formed and reduced in double: at positions past ~1e5 an fp32 angle
// (HF multiplies in fp32) is already off by more than 1e-2 rad; the double angle is the rotation HF's fp32
// inv_freq describes.
LCPLAN_HD void rope_cos_sin(int64_t pos, float inv_freq, float* c, float* s) {
  const double a = static_cast<double>(pos) * static_cast<double>(inv_freq);
  *c = static_cast<float>(cos(a));
  *s = static_cast<float>(sin(a));
}
// (y1, y2) = (x1 cos - x2 sin, x2 cos + x1 sin) = x * cos + rotate_half(x) * sin for the pair (i, i + r/2).
// The backward is the inverse rotation: the same call with -sin.
LCPLAN_HD void rope_rotate(float x1, float x2, float c, float s, float* y1, float* y2) {
  const float a = x1 * c - x2 * s;
  const float b = x2 * c + x1 * s;
  *y1 = a;
  *y2 = b;
}

// ---- cost model (benchmarks and README) ----

// Forward: q k^T and p v, 2 * 2 * D FLOPs per visible (query, key) pair and query head.
constexpr double forward_flops(double hq, double d, double visible_pairs) { return 4.0 * hq * d * visible_pairs; }
// Backward: recompute q k^T, dv = p^T do, dp = do v^T, dq = ds k, dk = ds^T q: 5 * 2 * D per pair and head
// (2.5x the forward, as FlashAttention-2 counts it).
constexpr double backward_flops(double hq, double d, double visible_pairs) { return 10.0 * hq * d * visible_pairs; }

}  // namespace lcplan::attention
