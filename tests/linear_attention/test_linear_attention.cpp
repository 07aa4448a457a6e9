// Gated delta rule on the CPU: the chunked forward against the token-by-token double reference (HF's recurrent form)
// for several chunk sizes (C not dividing S, S < C, C = 1), the backward against the reference's analytic reverse pass
// and against central finite differences, state passing across a split (forward state and backward dS), the memory
// bounds, the conv1d (history == concatenation, gradients by finite differences), bad input.
//
// Tolerances (fp32 kernel vs double reference; q, k, v ~ N(0, 1), g in (-1.5, 0), beta in (0.05, 0.95);
// |error| <= atol + rtol * |want|):
//   o, final state             : atol 5e-6, rtol 5e-5   (measured worst 9e-7)
//   dq, dk, dv, dg, dbeta, dS0 : atol 1e-5, rtol 1e-4   (measured worst 4e-7)
//   finite differences (double, h = 1e-6): reference backward within 1e-7 + 1e-6 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "tests/linear_attention/la_harness.h"

namespace lcplan::linear_attention {
namespace {

using lcplan::test::check_close;
using lcplan::test::max_abs_err;
using test::Case;
using test::make_case;
using test::run_cpu;
using test::run_reference;

constexpr double kFwdAtol = 5e-6, kFwdRtol = 5e-5;
constexpr double kGradAtol = 1e-5, kGradRtol = 1e-4;

template <class A, class B>
void expect_all_close(const test::Result<A>& got, const test::Result<B>& want, const char* tag) {
  SCOPED_TRACE(tag);
  EXPECT_TRUE(check_close("o", got.o, want.o, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(check_close("final state", got.state, want.state, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(check_close("dq", got.dq, want.dq, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dk", got.dk, want.dk, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dv", got.dv, want.dv, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dg", got.dg, want.dg, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dbeta", got.dbeta, want.dbeta, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dS0", got.ds0, want.ds0, kGradAtol, kGradRtol));
  std::printf("  %s: max |err| o %.2g state %.2g dq %.2g dk %.2g dv %.2g dg %.2g dbeta %.2g dS0 %.2g\n", tag,
              max_abs_err(got.o, want.o), max_abs_err(got.state, want.state), max_abs_err(got.dq, want.dq),
              max_abs_err(got.dk, want.dk), max_abs_err(got.dv, want.dv), max_abs_err(got.dg, want.dg),
              max_abs_err(got.dbeta, want.dbeta), max_abs_err(got.ds0, want.ds0));
}

class ChunkSizes : public ::testing::TestWithParam<int64_t> {};

// S = 50 against chunks 1, 7 (does not divide), 16, 50 (= S), 64 and 100 (> S).
TEST_P(ChunkSizes, ChunkedMatchesRecurrentReference) {
  Options o;
  o.chunk = GetParam();
  const Case c = make_case({50, 2, 4, 16, 12}, o, 101);
  expect_all_close(run_cpu(c), run_reference(c), ("chunk " + std::to_string(o.chunk)).c_str());
}

INSTANTIATE_TEST_SUITE_P(LinearAttention, ChunkSizes, ::testing::Values(1, 7, 16, 50, 64, 100));

TEST(LinearAttention, LongerSequenceQwenLikeRatios) {
  Options o;  // default chunk 64; 3 chunks, the last partial
  const Case c = make_case({170, 1, 2, 32, 24}, o, 102);
  expect_all_close(run_cpu(c), run_reference(c), "S=170 hk=1 hv=2");
}

TEST(LinearAttention, WithoutL2NormAndWithCustomScale) {
  Options o;
  o.chunk = 8;
  o.qk_l2norm = false;
  o.scale = 0.3f;
  // Unnormalised keys must stay small for the recurrence to be stable (||k||^2 beta < 2).
  const Case c = make_case({40, 2, 2, 8, 8}, o, 103, 0.25f);
  expect_all_close(run_cpu(c), run_reference(c), "no l2norm");
}

// Central differences of L = sum(o * w_o) + sum(S_final * w_s) through the double reference forward.
void finite_difference_check(bool l2) {
  Options o;
  o.chunk = 4;
  o.qk_l2norm = l2;
  const Shape s{6, 1, 2, 3, 2};
  const Case c = make_case(s, o, 104, l2 ? 1.0f : 0.5f);
  using lcplan::test::widen;
  auto q = widen(c.q), k = widen(c.k), v = widen(c.v), g = widen(c.g), b = widen(c.beta), s0 = widen(c.s0);
  const auto wo = widen(c.d_o), ws = widen(c.ds_final);
  auto loss = [&]() {
    std::vector<double> out(wo.size()), sf(ws.size());
    forward_reference(s, q.data(), k.data(), v.data(), g.data(), b.data(), s0.data(), out.data(), sf.data(), o);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * wo[i];
    for (size_t i = 0; i < sf.size(); ++i) l += sf[i] * ws[i];
    return l;
  };
  auto fd = [&](std::vector<double>& x) {
    std::vector<double> grad(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i], h = 1e-6;
      x[i] = keep + h;
      const double lp = loss();
      x[i] = keep - h;
      const double lm = loss();
      x[i] = keep;
      grad[i] = (lp - lm) / (2 * h);
    }
    return grad;
  };
  const auto gq = fd(q), gk = fd(k), gv = fd(v), gg = fd(g), gb = fd(b), gs0 = fd(s0);
  const auto ref = run_reference(c);
  EXPECT_TRUE(check_close("ref dq vs fd", ref.dq, gq, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dk vs fd", ref.dk, gk, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dv vs fd", ref.dv, gv, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dg vs fd", ref.dg, gg, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dbeta vs fd", ref.dbeta, gb, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dS0 vs fd", ref.ds0, gs0, 1e-7, 1e-6));
  const auto cpu = run_cpu(c);
  EXPECT_TRUE(check_close("cpu dq vs fd", cpu.dq, gq, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dk vs fd", cpu.dk, gk, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dv vs fd", cpu.dv, gv, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dg vs fd", cpu.dg, gg, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dbeta vs fd", cpu.dbeta, gb, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dS0 vs fd", cpu.ds0, gs0, kGradAtol, kGradRtol));
}

TEST(LinearAttention, GradientsMatchFiniteDifferences) { finite_difference_check(true); }
TEST(LinearAttention, GradientsMatchFiniteDifferencesWithoutL2Norm) { finite_difference_check(false); }

// Context parallelism: [0, S) equals [0, a) then [a, S) with the state handed forward and dS handed back.
TEST(LinearAttention, StatePassingAcrossASplitEqualsOneRun) {
  Options o;
  o.chunk = 8;
  const Shape full{45, 2, 4, 8, 6};
  const Case c = make_case(full, o, 105);
  const auto whole = run_cpu(c);
  const int64_t a = 19;  // not a multiple of the chunk
  const Shape s1{a, full.hk, full.hv, full.dk, full.dv}, s2{full.s - a, full.hk, full.hv, full.dk, full.dv};
  const size_t kr = size_t(full.hk * full.dk), vr = size_t(full.hv * full.dv), hr = size_t(full.hv);
  auto r1 = test::sized<float>(s1), r2 = test::sized<float>(s2);
  std::vector<float> mid(r1.state.size());
  forward_cpu(s1, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.s0.data(), r1.o.data(), mid.data(), o);
  forward_cpu(s2, c.q.data() + a * kr, c.k.data() + a * kr, c.v.data() + a * vr, c.g.data() + a * hr,
              c.beta.data() + a * hr, mid.data(), r2.o.data(), r2.state.data(), o);
  std::vector<float> o_cat = r1.o;
  o_cat.insert(o_cat.end(), r2.o.begin(), r2.o.end());
  EXPECT_TRUE(check_close("o across the split", o_cat, whole.o, 1e-6, 1e-5));
  EXPECT_TRUE(check_close("final state", r2.state, whole.state, 1e-6, 1e-5));
  // Backward: the later segment first, its dS0 becomes the earlier segment's dS_final.
  std::vector<float> ds_mid(mid.size());
  backward_cpu(s2, c.q.data() + a * kr, c.k.data() + a * kr, c.v.data() + a * vr, c.g.data() + a * hr,
               c.beta.data() + a * hr, mid.data(), c.d_o.data() + a * vr, c.ds_final.data(), r2.dq.data(), r2.dk.data(),
               r2.dv.data(), r2.dg.data(), r2.dbeta.data(), ds_mid.data(), o);
  backward_cpu(s1, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.s0.data(), c.d_o.data(),
               ds_mid.data(), r1.dq.data(), r1.dk.data(), r1.dv.data(), r1.dg.data(), r1.dbeta.data(), r1.ds0.data(), o);
  auto cat = [](std::vector<float> x, const std::vector<float>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  EXPECT_TRUE(check_close("dq", cat(r1.dq, r2.dq), whole.dq, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dk", cat(r1.dk, r2.dk), whole.dk, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dv", cat(r1.dv, r2.dv), whole.dv, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dg", cat(r1.dg, r2.dg), whole.dg, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dbeta", cat(r1.dbeta, r2.dbeta), whole.dbeta, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("dS0", r1.ds0, whole.ds0, 1e-5, 1e-4));
}

TEST(LinearAttention, NullStatesMeanZerosAndEmptySequencePassesStatesThrough) {
  Options o;
  o.chunk = 5;
  const Shape s{12, 1, 2, 4, 3};
  Case c = make_case(s, o, 106);
  std::fill(c.s0.begin(), c.s0.end(), 0.0f);
  std::fill(c.ds_final.begin(), c.ds_final.end(), 0.0f);
  const auto with_zeros = run_cpu(c);
  auto r = test::sized<float>(s);
  forward_cpu(s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), nullptr, r.o.data(), nullptr, o);
  backward_cpu(s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), nullptr, c.d_o.data(), nullptr,
               r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.dbeta.data(), nullptr, o);
  EXPECT_TRUE(check_close("o", r.o, with_zeros.o, 0.0, 0.0));
  EXPECT_TRUE(check_close("dq", r.dq, with_zeros.dq, 0.0, 0.0));
  EXPECT_TRUE(check_close("dg", r.dg, with_zeros.dg, 0.0, 0.0));
  // S = 0: the state goes through unchanged and so does dS.
  const Shape empty{0, 1, 2, 4, 3};
  const Case e = make_case(s, o, 107);
  std::vector<float> out(e.s0.size()), dsi(e.s0.size());
  forward_cpu(empty, nullptr, nullptr, nullptr, nullptr, nullptr, e.s0.data(), nullptr, out.data(), o);
  backward_cpu(empty, nullptr, nullptr, nullptr, nullptr, nullptr, e.s0.data(), nullptr, e.ds_final.data(), nullptr,
               nullptr, nullptr, nullptr, nullptr, dsi.data(), o);
  EXPECT_TRUE(check_close("state through", out, e.s0, 0.0, 0.0));
  EXPECT_TRUE(check_close("dS through", dsi, e.ds_final, 0.0, 0.0));
}

TEST(LinearAttention, ForwardMemoryIsIndependentOfLengthAndBackwardLinear) {
  Options o;
  o.chunk = 16;
  size_t first = 0;
  for (const int64_t len : {64, 256, 1024}) {
    const Shape s{len, 1, 2, 16, 16};
    const Case c = make_case(s, o, 108);
    Stats fs, bs;
    run_cpu(c, &fs, &bs);
    EXPECT_GT(fs.peak_extra_bytes, 0u);
    EXPECT_LE(fs.peak_extra_bytes, cpu_forward_extra_bytes_bound(s, o)) << len;
    EXPECT_LE(bs.peak_extra_bytes, cpu_backward_extra_bytes_bound(s, o)) << len;
    if (first == 0) first = fs.peak_extra_bytes;
    EXPECT_EQ(fs.peak_extra_bytes, first) << len;
  }
  // The backward bound grows by one [dk x dv] state per extra chunk and nothing else.
  const Shape a{1024, 1, 2, 16, 16}, b{2048, 1, 2, 16, 16};
  EXPECT_EQ(cpu_backward_extra_bytes_bound(b, o) - cpu_backward_extra_bytes_bound(a, o),
            size_t(1024 / 16) * 16 * 16 * sizeof(float));
  EXPECT_EQ(cpu_forward_extra_bytes_bound(a, o), cpu_forward_extra_bytes_bound(b, o));
}

TEST(LinearAttention, BadArgumentsThrowOneSentence) {
  auto expect_bad = [](const Shape& s, const Options& o, const char* needle) {
    try {
      validate(s, o);
      ADD_FAILURE() << "no throw for " << needle;
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_EQ(m.back(), '.') << m;
    }
  };
  const Options good;
  expect_bad({-1, 1, 1, 4, 4}, good, "tokens s (-1)");
  expect_bad({4, 2, 3, 4, 4}, good, "value heads hv (3) must be a positive multiple of key heads hk (2)");
  expect_bad({4, 0, 2, 4, 4}, good, "key heads hk (0)");
  expect_bad({4, 1, 1, 0, 4}, good, "dk (0)");
  expect_bad({4, 1, 1, 4, 0}, good, "dv (0)");
  Options o = good;
  o.chunk = 0;
  expect_bad({4, 1, 1, 4, 4}, o, "chunk (0)");
  o = good;
  o.scale = -2.0f;
  expect_bad({4, 1, 1, 4, 4}, o, "scale");
  std::vector<float> buf(64);
  EXPECT_THROW(forward_cpu({4, 1, 1, 4, 4}, nullptr, buf.data(), buf.data(), buf.data(), buf.data(), nullptr,
                           buf.data(), nullptr, good),
               std::invalid_argument);
  EXPECT_THROW(validate_conv({4, 0, 4, true}), std::invalid_argument);
  EXPECT_THROW(validate_conv({4, 3, 0, true}), std::invalid_argument);
}

// ---- causal conv1d ----

struct ConvData {
  Conv c;
  std::vector<float> x, hist, w, bias, dy;
};

ConvData make_conv(int64_t s, int64_t ch, int64_t k, bool silu, uint64_t seed) {
  ConvData d{{s, ch, k, silu}, {}, {}, {}, {}, {}};
  d.x = lcplan::test::randn(size_t(s * ch), seed);
  d.hist = lcplan::test::randn(size_t((k - 1) * ch), seed + 1);
  d.w = lcplan::test::randn(size_t(ch * k), seed + 2, 0.5f);
  d.bias = lcplan::test::randn(size_t(ch), seed + 3, 0.2f);
  d.dy = lcplan::test::randn(size_t(s * ch), seed + 4);
  return d;
}

TEST(Conv1d, ForwardMatchesDoubleReference) {
  for (const bool silu : {true, false}) {
    const ConvData d = make_conv(23, 5, 4, silu, 201);
    std::vector<float> y(d.x.size());
    std::vector<double> want(d.x.size());
    conv1d_forward_cpu(d.c, d.x.data(), d.hist.data(), d.w.data(), d.bias.data(), y.data());
    using lcplan::test::widen;
    const auto x = widen(d.x), h = widen(d.hist), w = widen(d.w), b = widen(d.bias);
    conv1d_forward_reference(d.c, x.data(), h.data(), w.data(), b.data(), want.data());
    EXPECT_TRUE(check_close("conv y", y, want, 1e-6, 1e-5));
  }
}

// Running a segment with its history equals running [history; x] from zeros and dropping the first K-1 rows; the
// backward's d_history equals the concatenation's gradient on those rows.
TEST(Conv1d, HistoryEqualsConcatenation) {
  for (const int64_t s : {int64_t(17), int64_t(2)}) {  // 2 < K - 1: the next history reaches into the old one
    const int64_t ch = 6, k = 4;
    const ConvData d = make_conv(s, ch, k, true, 202);
    Conv cat = d.c;
    cat.s = s + k - 1;
    std::vector<float> xc = d.hist;
    xc.insert(xc.end(), d.x.begin(), d.x.end());
    std::vector<float> dyc(size_t((k - 1) * ch), 0.0f);  // the history rows' outputs belong to the previous rank
    dyc.insert(dyc.end(), d.dy.begin(), d.dy.end());
    std::vector<float> y(d.x.size()), yc(xc.size());
    conv1d_forward_cpu(d.c, d.x.data(), d.hist.data(), d.w.data(), nullptr, y.data());
    conv1d_forward_cpu(cat, xc.data(), nullptr, d.w.data(), nullptr, yc.data());
    EXPECT_TRUE(check_close("y", y.data(), yc.data() + (k - 1) * ch, y.size(), 0.0, 0.0));

    std::vector<float> dx(d.x.size()), dh(d.hist.size()), dw(d.w.size()), dxc(xc.size()), dwc(d.w.size());
    conv1d_backward_cpu(d.c, d.x.data(), d.hist.data(), d.w.data(), nullptr, d.dy.data(), dx.data(), dh.data(),
                        dw.data(), nullptr);
    conv1d_backward_cpu(cat, xc.data(), nullptr, d.w.data(), nullptr, dyc.data(), dxc.data(), nullptr, dwc.data(),
                        nullptr);
    EXPECT_TRUE(check_close("d_history", dh.data(), dxc.data(), dh.size(), 1e-6, 1e-6));
    EXPECT_TRUE(check_close("dx", dx.data(), dxc.data() + (k - 1) * ch, dx.size(), 1e-6, 1e-6));
    EXPECT_TRUE(check_close("d_weight", dw, dwc, 1e-5, 1e-5));

    std::vector<float> next(d.hist.size());
    conv1d_next_history(d.c, d.x.data(), d.hist.data(), next.data());
    EXPECT_TRUE(check_close("next history", next.data(), xc.data() + (xc.size() - next.size()), next.size(), 0.0, 0.0));
  }
}

TEST(Conv1d, GradientsMatchFiniteDifferences) {
  for (const bool silu : {true, false}) {
    const ConvData d = make_conv(7, 3, 4, silu, 203);
    using lcplan::test::widen;
    auto x = widen(d.x), h = widen(d.hist), w = widen(d.w), b = widen(d.bias);
    const auto wy = widen(d.dy);
    auto loss = [&]() {
      std::vector<double> y(wy.size());
      conv1d_forward_reference(d.c, x.data(), h.data(), w.data(), b.data(), y.data());
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += y[i] * wy[i];
      return l;
    };
    auto fd = [&](std::vector<double>& p) {
      std::vector<double> grad(p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        const double keep = p[i];
        p[i] = keep + 1e-6;
        const double lp = loss();
        p[i] = keep - 1e-6;
        const double lm = loss();
        p[i] = keep;
        grad[i] = (lp - lm) / 2e-6;
      }
      return grad;
    };
    const auto gx = fd(x), gh = fd(h), gw = fd(w), gb = fd(b);
    std::vector<float> dx(d.x.size()), dh(d.hist.size()), dw(d.w.size()), db(d.bias.size());
    conv1d_backward_cpu(d.c, d.x.data(), d.hist.data(), d.w.data(), d.bias.data(), d.dy.data(), dx.data(), dh.data(),
                        dw.data(), db.data());
    EXPECT_TRUE(check_close("dx", dx, gx, 1e-5, 1e-4));
    EXPECT_TRUE(check_close("d_history", dh, gh, 1e-5, 1e-4));
    EXPECT_TRUE(check_close("d_weight", dw, gw, 1e-5, 1e-4));
    EXPECT_TRUE(check_close("d_bias", db, gb, 1e-5, 1e-4));
  }
}

}  // namespace
}  // namespace lcplan::linear_attention
