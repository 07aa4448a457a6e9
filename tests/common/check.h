// Test helpers shared by the kernel and executor tests: an llm.c-style element checker that prints the
// first few mismatches (index, got, want) and stops, random tensors, and float <-> double copies.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace lcplan::test {

// |got - want| <= atol + rtol * |want| for every element (equal infinities match, NaN never does). Prints the
// first `max_print` mismatches as "name[index]: got X want Y" and then the count and the largest error; returns true
// when everything matched. Use as EXPECT_TRUE(check_close(...)).
template <class G, class W>
bool check_close(const char* name, const G* got, const W* want, size_t n, double atol, double rtol, int max_print = 5) {
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    bool ok;
    if (std::isinf(w) || std::isinf(g)) ok = g == w;
    else {
      const double err = std::fabs(g - w);
      ok = err <= atol + rtol * std::fabs(w);  // false for NaN
      if (std::isfinite(err) && err > worst) worst = err;
    }
    if (!ok) {
      if (static_cast<int>(bad) < max_print) std::printf("  %s[%zu]: got %.9g want %.9g\n", name, i, g, w);
      ++bad;
    }
  }
  if (bad > 0)
    std::printf("  %s: %zu of %zu elements outside atol %.1e + rtol %.1e (largest finite error %.3g)\n", name, bad, n,
                atol, rtol, worst);
  return bad == 0;
}

template <class G, class W>
bool check_close(const char* name, const std::vector<G>& got, const std::vector<W>& want, double atol, double rtol) {
  if (got.size() != want.size()) {
    std::printf("  %s: size %zu, want %zu\n", name, got.size(), want.size());
    return false;
  }
  return check_close(name, got.data(), want.data(), got.size(), atol, rtol);
}

// Largest |got - want| over finite pairs (for reporting measured errors next to the tolerances).
template <class G, class W>
double max_abs_err(const std::vector<G>& got, const std::vector<W>& want) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (std::isfinite(e)) worst = std::max(worst, e);
  }
  return worst;
}

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = mean + scale * nd(rng);
  return x;
}

inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = u(rng);
  return x;
}

inline std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

}  // namespace lcplan::test
