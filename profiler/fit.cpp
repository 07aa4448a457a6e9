#include "profiler/fit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

namespace lcplan::profiler {

namespace {

struct Trial {
  double max = 0, sse = 0;
};

// Best max for a fixed half and its squared error.
Trial best_max(const std::vector<double>& x, const std::vector<double>& y, double half, double max_cap) {
  double fy = 0, ff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = x[i] <= 0 ? 0 : x[i] / (x[i] + half);
    fy += f * y[i];
    ff += f * f;
  }
  Trial t;
  t.max = ff > 0 ? std::clamp(fy / ff, 0.0, max_cap) : 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = x[i] <= 0 ? 0 : x[i] / (x[i] + half);
    const double r = y[i] - t.max * f;
    t.sse += r * r;
  }
  return t;
}

}  // namespace

CurveFit fit_saturating(const std::vector<double>& x, const std::vector<double>& y, double max_cap, double half_cap) {
  if (x.size() != y.size()) throw std::invalid_argument("fit_saturating: x and y differ in length");
  double xmin = 0, xmax = 0;
  for (double v : x)
    if (v > 0) xmin = xmin > 0 ? std::min(xmin, v) : v, xmax = std::max(xmax, v);
  if (xmax <= 0) throw std::invalid_argument("fit_saturating: no point with x > 0");
  // Scan log(half) from well below the smallest x to the cap, plus half = 0 (a flat curve).
  const double lo = std::log(std::max(xmin * 1e-3, 1e-9)), hi = std::log(std::max(half_cap, xmin * 1e-3 * 2));
  const int steps = 200;
  double best_h = 0;
  Trial best = best_max(x, y, 0, max_cap);
  double best_u = lo;
  for (int s = 0; s <= steps; ++s) {
    const double u = lo + (hi - lo) * s / steps;
    const Trial t = best_max(x, y, std::exp(u), max_cap);
    if (t.sse < best.sse) best = t, best_h = std::exp(u), best_u = u;
  }
  if (best_h > 0) {
    // Golden-section refinement of log(half) around the best grid point.
    const double step = (hi - lo) / steps, g = (std::sqrt(5.0) - 1) / 2;
    double a = std::max(lo, best_u - step), b = std::min(hi, best_u + step);
    double c = b - g * (b - a), d = a + g * (b - a);
    double fc = best_max(x, y, std::exp(c), max_cap).sse, fd = best_max(x, y, std::exp(d), max_cap).sse;
    for (int it = 0; it < 60; ++it) {
      if (fc < fd) b = d, d = c, fd = fc, c = b - g * (b - a), fc = best_max(x, y, std::exp(c), max_cap).sse;
      else a = c, c = d, fc = fd, d = a + g * (b - a), fd = best_max(x, y, std::exp(d), max_cap).sse;
    }
    const double u = (a + b) / 2;
    const Trial t = best_max(x, y, std::exp(u), max_cap);
    if (t.sse <= best.sse) best = t, best_h = std::exp(u);
  }
  CurveFit f;
  f.max = best.max;
  f.half = std::min(best_h, half_cap);
  f.points = int(x.size());
  f.rms = std::sqrt(best.sse / double(x.size()));
  return f;
}

AlphaBetaFit fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t) {
  if (x.size() != t.size()) throw std::invalid_argument("fit_alpha_beta: x and t differ in length");
  bool distinct = false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(t[i] > 0) || x[i] < 0) throw std::invalid_argument("fit_alpha_beta: times must be positive and sizes non-negative");
    if (x[i] != x.front()) distinct = true;
  }
  if (x.size() < 2 || !distinct) throw std::invalid_argument("fit_alpha_beta: needs two points of different size");
  // Weighted normal equations for t = a + b x, weight w = 1/t^2.
  auto solve = [&](bool with_alpha) {
    double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double w = 1 / (t[i] * t[i]);
      sw += w, sx += w * x[i], sxx += w * x[i] * x[i], st += w * t[i], sxt += w * x[i] * t[i];
    }
    if (!with_alpha) return std::pair<double, double>{0, sxx > 0 ? sxt / sxx : 0};
    const double det = sw * sxx - sx * sx;
    const double b = (sw * sxt - sx * st) / det;
    return std::pair<double, double>{(st - b * sx) / sw, b};
  };
  auto [a, b] = solve(true);
  if (a < 0) std::tie(a, b) = solve(false);  // alpha >= 0: refit through the origin
  if (!(b > 0)) throw std::invalid_argument("fit_alpha_beta: time does not grow with size (no bandwidth to fit)");
  AlphaBetaFit f;
  f.alpha = a;
  f.bandwidth = 1 / b;
  f.points = int(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = (a + b * x[i]) / t[i] - 1;
    s += r * r;
  }
  f.rms_rel = std::sqrt(s / double(x.size()));
  return f;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t n = v.size(), m = n / 2;
  std::nth_element(v.begin(), v.begin() + m, v.end());
  if (n % 2) return v[m];
  const double hi = v[m];
  return (*std::max_element(v.begin(), v.begin() + m) + hi) / 2;
}

}  // namespace lcplan::profiler
