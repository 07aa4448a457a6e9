// One attention problem (random inputs, shape, options) and its CPU and double-reference results; shared by the CPU
// and CUDA attention tests.
#pragma once

#include <vector>

#include "kernels/attention/attention.h"
#include "tests/common/check.h"

namespace lcplan::attention::test {

struct Case {
  Shape s;
  Options o;
  std::vector<float> q, k, v, d_o;
};

inline Case make_case(Shape s, Options o, uint64_t seed) {
  Case c{s, o, {}, {}, {}, {}};
  c.q = lcplan::test::randn(size_t(s.sq * s.hq * s.d), seed);
  c.k = lcplan::test::randn(size_t(s.sk * s.hkv * s.d), seed + 1);
  c.v = lcplan::test::randn(size_t(s.sk * s.hkv * s.d), seed + 2);
  c.d_o = lcplan::test::randn(size_t(s.sq * s.hq * s.d), seed + 3);
  return c;
}

template <class T>
struct Result {
  std::vector<T> o, lse, dq, dk, dv;
};

inline Result<float> run_cpu(const Case& c, Stats* fs = nullptr, Stats* bs = nullptr) {
  const Shape& s = c.s;
  Result<float> r;
  r.o.resize(size_t(s.sq * s.hq * s.d));
  r.lse.resize(size_t(s.hq * s.sq));
  r.dq.resize(r.o.size());
  r.dk.resize(size_t(s.sk * s.hkv * s.d));
  r.dv.resize(r.dk.size());
  forward_cpu(s, c.q.data(), c.k.data(), c.v.data(), r.o.data(), r.lse.data(), c.o, fs);
  backward_cpu(s, c.q.data(), c.k.data(), c.v.data(), r.o.data(), r.lse.data(), c.d_o.data(), r.dq.data(), r.dk.data(),
               r.dv.data(), c.o, bs);
  return r;
}

inline Result<double> run_reference(const Case& c) {
  const Shape& s = c.s;
  Result<double> r;
  const auto q = lcplan::test::widen(c.q), k = lcplan::test::widen(c.k), v = lcplan::test::widen(c.v),
             d_o = lcplan::test::widen(c.d_o);
  r.o.resize(size_t(s.sq * s.hq * s.d));
  r.lse.resize(size_t(s.hq * s.sq));
  r.dq.resize(r.o.size());
  r.dk.resize(size_t(s.sk * s.hkv * s.d));
  r.dv.resize(r.dk.size());
  forward_reference(s, q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), c.o);
  backward_reference(s, q.data(), k.data(), v.data(), d_o.data(), r.dq.data(), r.dk.data(), r.dv.data(), c.o);
  return r;
}

}  // namespace lcplan::attention::test
