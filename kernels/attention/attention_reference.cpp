// Naive attention in double, materialising the whole score matrix of a head: the textbook softmax(q k^T * scale) v and
// its backward (dP = dO V^T, dS = P * (dP - rowsum(dP * P))). Written independently of attention_math.h (only the
// visibility rule is restated) so that the tests compare two derivations; for tests only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/attention.h"

namespace lcplan::attention {

namespace {

bool visible(const Options& o, int64_t i, int64_t j) {
  const int64_t qp = o.q_start + i, kp = o.k_start + j;
  if (o.causal && kp > qp) return false;
  if (o.window > 0 && qp - kp >= o.window) return false;
  return true;
}

// Probabilities P [Sq x Sk] of query head h (rows without a visible key are all zero); lse per row.
void probs(const Shape& s, const double* q, const double* k, const Options& o, int64_t h, std::vector<double>& p,
           std::vector<double>& lse) {
  const int64_t d = s.d, kh = h / (s.hq / s.hkv);
  const double scale = o.scale > 0.0f ? double(o.scale) : 1.0 / std::sqrt(double(d));
  p.assign(size_t(s.sq * s.sk), 0.0);
  lse.assign(size_t(s.sq), -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < s.sq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s.sk; ++j) {
      if (!visible(o, i, j)) continue;
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[(i * s.hq + h) * d + c] * k[(j * s.hkv + kh) * d + c];
      p[i * s.sk + j] = dot * scale;
      mx = std::max(mx, dot * scale);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (int64_t j = 0; j < s.sk; ++j)
      if (visible(o, i, j)) sum += std::exp(p[i * s.sk + j] - mx);
    lse[i] = mx + std::log(sum);
    for (int64_t j = 0; j < s.sk; ++j) p[i * s.sk + j] = visible(o, i, j) ? std::exp(p[i * s.sk + j] - lse[i]) : 0.0;
  }
}

}  // namespace

void forward_reference(const Shape& s, const double* q, const double* k, const double* v, double* o, double* lse,
                       const Options& opt) {
  validate(s, opt);
  const int64_t d = s.d, group = s.hq / s.hkv;
  std::vector<double> p, l;
  for (int64_t h = 0; h < s.hq; ++h) {
    probs(s, q, k, opt, h, p, l);
    for (int64_t i = 0; i < s.sq; ++i) {
      lse[h * s.sq + i] = l[i];
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < s.sk; ++j) acc += p[i * s.sk + j] * v[(j * s.hkv + h / group) * d + c];
        o[(i * s.hq + h) * d + c] = acc;
      }
    }
  }
}

void backward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* d_o,
                        double* dq, double* dk, double* dv, const Options& opt) {
  validate(s, opt);
  const int64_t d = s.d, group = s.hq / s.hkv;
  const double scale = opt.scale > 0.0f ? double(opt.scale) : 1.0 / std::sqrt(double(d));
  std::fill(dq, dq + s.sq * s.hq * d, 0.0);
  std::fill(dk, dk + s.sk * s.hkv * d, 0.0);
  std::fill(dv, dv + s.sk * s.hkv * d, 0.0);
  std::vector<double> p, l, dp(size_t(s.sq * s.sk));
  for (int64_t h = 0; h < s.hq; ++h) {
    const int64_t kh = h / group;
    probs(s, q, k, opt, h, p, l);
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t j = 0; j < s.sk; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += d_o[(i * s.hq + h) * d + c] * v[(j * s.hkv + kh) * d + c];
        dp[i * s.sk + j] = acc;
      }
    for (int64_t i = 0; i < s.sq; ++i) {
      double rowdot = 0;  // sum_j P_ij dP_ij (equals rowsum(dO * O) by construction)
      for (int64_t j = 0; j < s.sk; ++j) rowdot += p[i * s.sk + j] * dp[i * s.sk + j];
      for (int64_t j = 0; j < s.sk; ++j) {
        const double pij = p[i * s.sk + j];
        const double ds = pij * (dp[i * s.sk + j] - rowdot) * scale;
        for (int64_t c = 0; c < d; ++c) {
          dq[(i * s.hq + h) * d + c] += ds * k[(j * s.hkv + kh) * d + c];
          dk[(j * s.hkv + kh) * d + c] += ds * q[(i * s.hq + h) * d + c];
          dv[(j * s.hkv + kh) * d + c] += pij * d_o[(i * s.hq + h) * d + c];
        }
      }
    }
  }
}

}  // namespace lcplan::attention
