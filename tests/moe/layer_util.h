// Helpers for the distributed MoE layer tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/comm/helpers.h"
#include "kernels/moe/moe_cpu.h"

namespace lcplan::moe::tests {

using helpers::invalid_argument_of;
using helpers::World;

// max|a - b| / max|b|: a relative error that does not blow up on elements that cancel to ~0.
template <class B>
double rel_err(const std::vector<float>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline std::vector<float> inputs(int tokens, int hidden, int seed) {
  std::vector<float> x(size_t(tokens) * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i) + 1.3f * float(seed)) * 1.5f;
  return x;
}

struct Pass {
  std::vector<float> out, dx;
  MoeWeights grads;
};

inline Pass run_pass(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                     const std::vector<float>& x, int tokens, const std::vector<float>& dout, ExecOptions o = {}) {
  Pass p;
  p.out.assign(size_t(tokens) * c.hidden, 0.f);
  p.dx.assign(size_t(tokens) * c.hidden, 0.f);
  MoeSaved saved;
  moe_forward(ep, c, w, s, x.data(), tokens, p.out.data(), saved, o);
  moe_backward(ep, c, w, s, saved, dout.data(), p.dx.data(), p.grads, o);
  return p;
}

// Every named gradient tensor, for comparisons.
inline std::vector<std::pair<std::string, const std::vector<float>*>> tensors(const MoeWeights& g) {
  return {{"router", &g.router}, {"w1", &g.w1}, {"w2", &g.w2}, {"shared_w1", &g.shared_w1},
          {"shared_w2", &g.shared_w2}, {"shared_gate", &g.shared_gate}};
}

// Output, input grad and every weight grad of `p` equal `base` bit for bit (the relative error is shown on failure).
inline void expect_bit_identical(const Pass& p, const Pass& base, const std::string& what) {
  EXPECT_TRUE(bit_equal(p.out, base.out)) << what << " out, rel err " << rel_err(p.out, base.out);
  EXPECT_TRUE(bit_equal(p.dx, base.dx)) << what << " dx, rel err " << rel_err(p.dx, base.dx);
  const auto a = tensors(p.grads), b = tensors(base.grads);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(bit_equal(*a[i].second, *b[i].second))
        << what << " grad " << a[i].first << ", rel err " << rel_err(*a[i].second, *b[i].second);
}

}  // namespace lcplan::moe::tests
