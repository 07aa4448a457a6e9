// Tile math of linear cross-entropy, shared verbatim by the CPU implementation and the CUDA kernels.
//
// Per token i with logits z_i = h_i . W^T (optionally soft-capped: c * tanh(z / c)):
//   lse_i  = log sum_v exp(z_iv), built tile by tile from a running (max, sum-exp) pair merged with lse_merge;
//   loss_i = lse_i - z_i[target_i] + zloss * lse_i^2            (0 for ignored tokens);
//   d z_iv = g_i * (softmax_iv * (1 + 2 zloss lse_i) - [v == target_i]) * dcap(z_iv),
// where g_i is the upstream gradient of loss_i (1/n_valid for mean, 1 for sum, grad[i] for none).
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/common/hd.h"

namespace lcplan::linear_ce {

enum class Reduction : uint8_t { None, Mean, Sum };

// Running log-sum-exp over a stream of logits: m is the largest logit seen, s = sum exp(x - m).
struct LseState {
  float m;
  float s;
};

LCPLAN_HD LseState lse_empty() { return LseState{-INFINITY, 0.0f}; }

// log-add-exp of two partial states in (max, sum-exp) form; never evaluates exp of a positive number, so it cannot
// overflow.
LCPLAN_HD LseState lse_merge(LseState a, LseState b) {
  if (a.m == -INFINITY) return b;  // avoids (-inf) - (-inf) = NaN when a side is empty
  if (b.m == -INFINITY) return a;
  if (a.m >= b.m) return LseState{a.m, a.s + b.s * expf(b.m - a.m)};
  return LseState{b.m, b.s + a.s * expf(a.m - b.m)};
}

LCPLAN_HD LseState lse_push(LseState a, float x) { return lse_merge(a, LseState{x, 1.0f}); }

LCPLAN_HD float lse_value(LseState a) { return a.m == -INFINITY ? -INFINITY : a.m + logf(a.s); }

// Re-expresses a sum-exp taken relative to m_local relative to a larger m_global (cross-rank combine).
LCPLAN_HD float lse_rescale(float s, float m_local, float m_global) {
  return m_local == -INFINITY ? 0.0f : s * expf(m_local - m_global);
}

// Optional logit soft-cap (Gemma style); cap <= 0 disables it.
LCPLAN_HD float softcap_apply(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }
// d capped / d raw, written in terms of the capped value so the backward needs no second tanh.
LCPLAN_HD float softcap_grad(float capped, float cap) {
  if (cap <= 0.0f) return 1.0f;
  const float t = capped / cap;
  return 1.0f - t * t;
}

LCPLAN_HD bool is_ignored(int64_t target, int64_t ignore_index) { return target == ignore_index; }

LCPLAN_HD float token_loss(float lse, float target_logit, float zloss) { return lse - target_logit + zloss * lse * lse; }

// Upstream gradient of token i's loss given the reduction; ignored tokens get 0 so their whole row vanishes.
LCPLAN_HD float upstream_grad(Reduction r, bool ignored, const float* grad_loss, int64_t i, int64_t n_valid) {
  if (ignored) return 0.0f;
  if (r == Reduction::None) return grad_loss[i];
  if (r == Reduction::Sum) return grad_loss[0];
  return n_valid > 0 ? grad_loss[0] / static_cast<float>(n_valid) : 0.0f;
}

// Gradient of the loss with respect to one raw logit, from its capped value and the token's final lse.
LCPLAN_HD float logit_grad(float capped, float lse, bool is_target, float g, float zloss, float cap) {
  const float p = expf(capped - lse);
  const float d = p * (1.0f + 2.0f * zloss * lse) - (is_target ? 1.0f : 0.0f);
  return g * d * softcap_grad(capped, cap);
}

// Cost model used by the benchmarks and the README (N tokens, H hidden, V vocabulary).
constexpr double forward_flops(double n, double h, double v) { return 2.0 * n * h * v; }
// Backward recomputes the logits (2NHV) and forms d_hidden and d_weight (2 x 2NHV).
constexpr double backward_flops(double n, double h, double v) { return 6.0 * n * h * v; }

}  // namespace lcplan::linear_ce
