// One gated-delta-rule problem (random inputs in Qwen3.5's ranges: g < 0, beta in (0, 1)) and its CPU and
// double-reference results; shared by the CPU and CUDA linear-attention tests.
#pragma once

#include <vector>

#include "kernels/linear_attention/linear_attention.h"
#include "tests/common/check.h"

namespace lcplan::linear_attention::test {

struct Case {
  Shape s;
  Options o;
  std::vector<float> q, k, v, g, beta, s0, d_o, ds_final;
};

inline Case make_case(Shape s, Options o, uint64_t seed, float k_scale = 1.0f) {
  Case c{s, o, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t nk = size_t(s.s * s.hk * s.dk), nv = size_t(s.s * s.hv * s.dv), nh = size_t(s.s * s.hv),
               st = size_t(s.hv * s.dk * s.dv);
  c.q = lcplan::test::randn(nk, seed);
  c.k = lcplan::test::randn(nk, seed + 1, k_scale);
  c.v = lcplan::test::randn(nv, seed + 2);
  c.g = lcplan::test::uniform(nh, seed + 3, -1.5f, -0.01f);
  c.beta = lcplan::test::uniform(nh, seed + 4, 0.05f, 0.95f);
  c.s0 = lcplan::test::randn(st, seed + 5, 0.5f);
  c.d_o = lcplan::test::randn(nv, seed + 6);
  c.ds_final = lcplan::test::randn(st, seed + 7, 0.5f);
  return c;
}

template <class T>
struct Result {
  std::vector<T> o, state, dq, dk, dv, dg, dbeta, ds0;
};

template <class T>
Result<T> sized(const Shape& s) {
  Result<T> r;
  r.o.resize(size_t(s.s * s.hv * s.dv));
  r.state.resize(size_t(s.hv * s.dk * s.dv));
  r.dq.resize(size_t(s.s * s.hk * s.dk));
  r.dk.resize(r.dq.size());
  r.dv.resize(r.o.size());
  r.dg.resize(size_t(s.s * s.hv));
  r.dbeta.resize(r.dg.size());
  r.ds0.resize(r.state.size());
  return r;
}

inline Result<float> run_cpu(const Case& c, Stats* fs = nullptr, Stats* bs = nullptr) {
  Result<float> r = sized<float>(c.s);
  forward_cpu(c.s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.s0.data(), r.o.data(),
              r.state.data(), c.o, fs);
  backward_cpu(c.s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.s0.data(), c.d_o.data(),
               c.ds_final.data(), r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), r.ds0.data(),
               c.o, bs);
  return r;
}

inline Result<double> run_reference(const Case& c) {
  using lcplan::test::widen;
  Result<double> r = sized<double>(c.s);
  const auto q = widen(c.q), k = widen(c.k), v = widen(c.v), g = widen(c.g), b = widen(c.beta), s0 = widen(c.s0),
             d_o = widen(c.d_o), dsf = widen(c.ds_final);
  forward_reference(c.s, q.data(), k.data(), v.data(), g.data(), b.data(), s0.data(), r.o.data(), r.state.data(), c.o);
  backward_reference(c.s, q.data(), k.data(), v.data(), g.data(), b.data(), s0.data(), d_o.data(), dsf.data(),
                     r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), r.ds0.data(), c.o);
  return r;
}

}  // namespace lcplan::linear_attention::test
