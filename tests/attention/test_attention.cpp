// CPU attention against the double reference (odd shapes, GQA, causal with context-parallel offsets, sliding
// windows, fully-masked rows), gradients against the reference and central finite differences, the
// context-parallel split + log-sum-exp merge, the memory bound, RoPE, and bad input.
//
// Tolerances (fp32 kernel vs double reference, inputs ~ N(0, 1), |error| <= atol + rtol * |want|):
//   o, lse      : atol 2e-6, rtol 2e-5   (measured worst ~3e-7 at these shapes)
//   dq, dk, dv  : atol 2e-5, rtol 2e-4   (measured worst ~2e-6; dk / dv sum over a whole GQA group)
//   finite differences (double, h = 1e-6): the reference backward within 1e-7 absolute, the CPU backward within
//   the gradient tolerance above.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "tests/attention/attention_harness.h"

namespace lcplan::attention {
namespace {

using lcplan::test::check_close;
using test::Case;
using test::make_case;
using test::run_cpu;
using test::run_reference;

constexpr double kFwdAtol = 2e-6, kFwdRtol = 2e-5;
constexpr double kGradAtol = 2e-5, kGradRtol = 2e-4;

struct Config {
  const char* name;
  Shape s;
  bool causal;
  int64_t window, q_start, k_start, q_tile, k_tile;
};

Options options_of(const Config& c) {
  Options o;
  o.causal = c.causal;
  o.window = c.window;
  o.q_start = c.q_start;
  o.k_start = c.k_start;
  o.q_tile = c.q_tile;
  o.k_tile = c.k_tile;
  return o;
}

const Shape kOdd{37, 101, 6, 2, 24};

// Every configuration runs with odd tiles (7 x 13: partial tiles everywhere) and one with the defaults.
const Config kConfigs[] = {
    {"full", kOdd, false, 0, 0, 0, 7, 13},
    {"full_default_tiles", kOdd, false, 0, 0, 0, 64, 128},
    {"causal_aligned", kOdd, true, 0, 0, 0, 7, 13},
    {"causal_cp_middle_chunk", kOdd, true, 0, 60, 0, 7, 13},        // queries 60..96 against keys 0..100
    {"causal_queries_after_keys", kOdd, true, 0, 150, 20, 7, 13},   // every key in the past
    {"causal_rows_without_keys", kOdd, true, 0, 30, 50, 7, 13},     // queries 30..49 see nothing
    {"causal_window", kOdd, true, 17, 60, 0, 7, 13},
    {"window_not_causal", kOdd, false, 9, 40, 0, 7, 13},
    {"mha", {29, 45, 3, 3, 16}, true, 0, 16, 0, 8, 8},
    {"mqa_odd_d", {23, 31, 4, 1, 7}, true, 5, 10, 3, 5, 6},
    {"one_query", {1, 57, 2, 1, 8}, true, 0, 40, 0, 3, 11},
};

class AttentionVsReference : public ::testing::TestWithParam<Config> {};

TEST_P(AttentionVsReference, ForwardAndBackward) {
  const Config& cfg = GetParam();
  const Case c = make_case(cfg.s, options_of(cfg), 11);
  const auto got = run_cpu(c);
  const auto want = run_reference(c);
  EXPECT_TRUE(check_close("o", got.o, want.o, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(check_close("lse", got.lse, want.lse, kFwdAtol, kFwdRtol));
  EXPECT_TRUE(check_close("dq", got.dq, want.dq, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dk", got.dk, want.dk, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("dv", got.dv, want.dv, kGradAtol, kGradRtol));
  std::printf("  %s: max |err| o %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n", cfg.name,
              lcplan::test::max_abs_err(got.o, want.o), lcplan::test::max_abs_err(got.lse, want.lse),
              lcplan::test::max_abs_err(got.dq, want.dq), lcplan::test::max_abs_err(got.dk, want.dk),
              lcplan::test::max_abs_err(got.dv, want.dv));
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionVsReference, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

TEST(Attention, RowsWithoutVisibleKeysGiveZeroOutputMinusInfLseAndZeroGradient) {
  // Queries at 0..9, keys at 10..29, causal: no query sees a key. Then a window that hides every key.
  for (int variant = 0; variant < 2; ++variant) {
    Options o;
    o.causal = true;
    if (variant == 0) o.k_start = 10;
    else o.q_start = 100, o.window = 50;  // keys 0..19, queries 100..109: all further than the window
    const Case c = make_case({10, 20, 4, 2, 8}, o, 3);
    const auto r = run_cpu(c);
    for (float x : r.o) ASSERT_EQ(x, 0.0f);
    for (float x : r.lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
    for (float x : r.dq) ASSERT_EQ(x, 0.0f);
    for (float x : r.dk) ASSERT_EQ(x, 0.0f);
    for (float x : r.dv) ASSERT_EQ(x, 0.0f);
  }
}

TEST(Attention, NoKeysAndNoQueries) {
  Options o;
  o.causal = false;
  const Case c = make_case({5, 0, 2, 1, 4}, o, 4);
  const auto r = run_cpu(c);
  for (float x : r.o) EXPECT_EQ(x, 0.0f);
  for (float x : r.lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  for (float x : r.dq) EXPECT_EQ(x, 0.0f);
  const Case e = make_case({0, 7, 2, 1, 4}, o, 5);
  const auto r2 = run_cpu(e);
  for (float x : r2.dk) EXPECT_EQ(x, 0.0f);
  for (float x : r2.dv) EXPECT_EQ(x, 0.0f);
}

TEST(Attention, LargeScoresStayFinite) {
  Options o;
  o.scale = 8.0f;  // scores ~ N(0, 8^2 * D): exp without the running max would overflow
  o.q_tile = 5, o.k_tile = 9;
  o.q_start = 20;
  const Case c = make_case({17, 41, 2, 1, 16}, o, 6);
  const auto got = run_cpu(c);
  const auto want = run_reference(c);
  EXPECT_TRUE(check_close("o", got.o, want.o, 1e-5, 1e-4));
  EXPECT_TRUE(check_close("lse", got.lse, want.lse, 1e-5, 1e-5));
  EXPECT_TRUE(check_close("dq", got.dq, want.dq, 1e-3, 1e-3));
  EXPECT_TRUE(check_close("dk", got.dk, want.dk, 1e-3, 1e-3));
  EXPECT_TRUE(check_close("dv", got.dv, want.dv, 1e-5, 1e-4));
}

// Central finite differences of L = sum(o * w) through the double reference forward, against the reference's
// analytic backward (an independent derivation check) and the CPU backward.
TEST(Attention, GradientsMatchFiniteDifferences) {
  Options o;
  o.causal = true;
  o.window = 4;
  o.q_start = 3;
  o.k_start = 1;
  o.q_tile = 2, o.k_tile = 3;
  const Shape s{5, 7, 4, 2, 3};
  const Case c = make_case(s, o, 7);  // d_o plays w
  auto q = lcplan::test::widen(c.q), k = lcplan::test::widen(c.k), v = lcplan::test::widen(c.v);
  const auto w = lcplan::test::widen(c.d_o);
  auto loss = [&]() {
    std::vector<double> out(w.size()), lse(size_t(s.hq * s.sq));
    forward_reference(s, q.data(), k.data(), v.data(), out.data(), lse.data(), o);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * w[i];
    return l;
  };
  auto fd = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    const double h = 1e-6;
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + h;
      const double lp = loss();
      x[i] = keep - h;
      const double lm = loss();
      x[i] = keep;
      g[i] = (lp - lm) / (2 * h);
    }
    return g;
  };
  const auto gq = fd(q), gk = fd(k), gv = fd(v);
  const auto ref = run_reference(c);
  EXPECT_TRUE(check_close("ref dq vs fd", ref.dq, gq, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dk vs fd", ref.dk, gk, 1e-7, 1e-6));
  EXPECT_TRUE(check_close("ref dv vs fd", ref.dv, gv, 1e-7, 1e-6));
  const auto cpu = run_cpu(c);
  EXPECT_TRUE(check_close("cpu dq vs fd", cpu.dq, gq, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dk vs fd", cpu.dk, gk, kGradAtol, kGradRtol));
  EXPECT_TRUE(check_close("cpu dv vs fd", cpu.dv, gv, kGradAtol, kGradRtol));
  // Some gradient must be non-zero (a masked-out problem would pass trivially).
  double norm = 0;
  for (double x : gq) norm += x * x;
  EXPECT_GT(norm, 1e-3);
}

// What the executor does under context parallelism: keys split into two position ranges, each chunk run with its
// own k_start, the partial (o, lse) merged; the backward runs per chunk with the merged (o, lse).
TEST(Attention, KeySplitAndLogSumExpMergeEqualTheWholeProblem) {
  for (const bool window : {false, true}) {
    const Shape full{29, 90, 6, 3, 16};
    Options o;
    o.causal = true;
    o.window = window ? 40 : 0;
    o.q_start = 70;  // queries 70..98, keys 10..99: the last rank's chunk sees keys of both halves
    o.k_start = 10;
    o.q_tile = 8, o.k_tile = 16;
    const Case c = make_case(full, o, 9);
    const auto whole = run_cpu(c);
    const int64_t split = 37, d = full.d;
    Shape sa = full, sb = full;
    sa.sk = split;
    sb.sk = full.sk - split;
    Options oa = o, ob = o;
    ob.k_start = o.k_start + split;
    const size_t kv_row = size_t(full.hkv * d);
    const float* kb = c.k.data() + split * kv_row;
    const float* vb = c.v.data() + split * kv_row;
    std::vector<float> o_a(whole.o.size()), o_b(whole.o.size()), l_a(whole.lse.size()), l_b(whole.lse.size());
    forward_cpu(sa, c.q.data(), c.k.data(), c.v.data(), o_a.data(), l_a.data(), oa);
    forward_cpu(sb, c.q.data(), kb, vb, o_b.data(), l_b.data(), ob);
    std::vector<float> om(whole.o.size()), lm(whole.lse.size());
    merge_partials(full.sq, full.hq, d, o_a.data(), l_a.data(), o_b.data(), l_b.data(), om.data(), lm.data());
    EXPECT_TRUE(check_close("merged o", om, whole.o, 1e-6, 1e-5));
    EXPECT_TRUE(check_close("merged lse", lm, whole.lse, 1e-6, 1e-6));
    // In place into the first partial gives the same.
    merge_partials(full.sq, full.hq, d, o_a.data(), l_a.data(), o_b.data(), l_b.data(), o_a.data(), l_a.data());
    EXPECT_TRUE(check_close("merged in place", o_a, om, 0.0, 0.0));

    std::vector<float> dq_a(whole.dq.size()), dq_b(whole.dq.size()), dk(whole.dk.size()), dv(whole.dv.size());
    backward_cpu(sa, c.q.data(), c.k.data(), c.v.data(), om.data(), lm.data(), c.d_o.data(), dq_a.data(), dk.data(),
                 dv.data(), oa);
    backward_cpu(sb, c.q.data(), kb, vb, om.data(), lm.data(), c.d_o.data(), dq_b.data(), dk.data() + split * kv_row,
                 dv.data() + split * kv_row, ob);
    for (size_t i = 0; i < dq_a.size(); ++i) dq_a[i] += dq_b[i];
    EXPECT_TRUE(check_close("dq summed over key chunks", dq_a, whole.dq, 1e-5, 1e-4));
    EXPECT_TRUE(check_close("dk by chunk", dk, whole.dk, 1e-5, 1e-4));
    EXPECT_TRUE(check_close("dv by chunk", dv, whole.dv, 1e-5, 1e-4));
  }
}

TEST(Attention, MergeOfEmptyPartials) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> oa = {0, 0}, ob = {0, 0}, la = {-inf}, lb = {-inf}, o(2), l(1);
  merge_partials(1, 1, 2, oa.data(), la.data(), ob.data(), lb.data(), o.data(), l.data());
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
  EXPECT_EQ(l[0], -inf);
  ob = {1.5f, -2.0f};
  lb = {0.25f};
  merge_partials(1, 1, 2, oa.data(), la.data(), ob.data(), lb.data(), o.data(), l.data());
  EXPECT_EQ(o[0], 1.5f);
  EXPECT_EQ(o[1], -2.0f);
  EXPECT_EQ(l[0], 0.25f);
}

// Extra memory: measured peak under the bound for every key length, the bound independent of sk, and the same
// peak for a 16x longer key sequence.
TEST(Attention, ExtraMemoryIsIndependentOfKeyLength) {
  const Options o;  // default tiles 64 x 128
  size_t first_fwd = 0, first_bwd = 0;
  for (const int64_t sk : {256, 1024, 4096}) {
    const Shape s{200, sk, 4, 2, 32};
    Options oo = o;
    oo.causal = false;
    const Case c = make_case(s, oo, 12);
    Stats fs, bs;
    run_cpu(c, &fs, &bs);
    EXPECT_GT(fs.peak_extra_bytes, 0u);
    EXPECT_LE(fs.peak_extra_bytes, cpu_forward_extra_bytes_bound(s, oo)) << "sk " << sk;
    EXPECT_LE(bs.peak_extra_bytes, cpu_backward_extra_bytes_bound(s, oo)) << "sk " << sk;
    if (first_fwd == 0) first_fwd = fs.peak_extra_bytes, first_bwd = bs.peak_extra_bytes;
    EXPECT_EQ(fs.peak_extra_bytes, first_fwd) << "sk " << sk;
    EXPECT_EQ(bs.peak_extra_bytes, first_bwd) << "sk " << sk;
    // The score matrix alone would be sq * sk * 4 bytes per head.
    EXPECT_LT(cpu_backward_extra_bytes_bound(s, oo), size_t(s.sq * s.sk) * sizeof(float)) << "sk " << sk;
  }
  const Shape a{200, 256, 4, 2, 32}, b{200, 1 << 20, 4, 2, 32};
  EXPECT_EQ(cpu_forward_extra_bytes_bound(a, o), cpu_forward_extra_bytes_bound(b, o));
  EXPECT_EQ(cpu_backward_extra_bytes_bound(a, o), cpu_backward_extra_bytes_bound(b, o));
}

TEST(Attention, VisiblePairsCountsCausalHalf) {
  Options o;
  o.causal = true;
  EXPECT_EQ(visible_pairs({100, 100, 1, 1, 8}, o), 100.0 * 101.0 / 2.0);
  o.causal = false;
  EXPECT_EQ(visible_pairs({100, 100, 1, 1, 8}, o), 100.0 * 100.0);
  o.causal = true;
  o.window = 10;
  EXPECT_EQ(visible_pairs({100, 100, 1, 1, 8}, o), 10.0 * 11.0 / 2.0 + 90.0 * 10.0);
}

TEST(Attention, BadArgumentsThrowOneSentence) {
  const Shape ok{4, 4, 2, 1, 8};
  const Options good;
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
  expect_bad({-1, 4, 2, 1, 8}, good, "sq (-1)");
  expect_bad({4, -3, 2, 1, 8}, good, "sk (-3)");
  expect_bad({4, 4, 6, 4, 8}, good, "hq (6) must be a positive multiple of hkv (4)");
  expect_bad({4, 4, 2, 0, 8}, good, "hkv (0)");
  expect_bad({4, 4, 2, 1, 0}, good, "head dim d (0)");
  Options o = good;
  o.window = -2;
  expect_bad(ok, o, "window (-2)");
  o = good;
  o.q_tile = 0;
  expect_bad(ok, o, "q_tile (0)");
  o = good;
  o.scale = -1.0f;
  expect_bad(ok, o, "scale");
  std::vector<float> buf(64);
  EXPECT_THROW(forward_cpu(ok, nullptr, buf.data(), buf.data(), buf.data(), buf.data(), good), std::invalid_argument);
  RopeOptions r;
  r.rotary_dim = 5;
  EXPECT_THROW(rope_forward_cpu(2, 1, 8, buf.data(), buf.data(), r), std::invalid_argument);
  r.rotary_dim = 10;
  EXPECT_THROW(rope_forward_cpu(2, 1, 8, buf.data(), buf.data(), r), std::invalid_argument);
}

// ---- RoPE ----

// HF transformers' apply_rotary_pos_emb with partial rotary, written out directly in double.
std::vector<double> rope_hf(const std::vector<float>& x, int64_t s, int64_t h, int64_t d, int64_t r, float theta,
                            int64_t start) {
  std::vector<double> y(x.begin(), x.end());
  for (int64_t t = 0; t < s; ++t)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < r; ++i) {
        const int64_t f = i % (r / 2);  // emb = cat(freqs, freqs)
        const float inv = 1.0f / std::pow(theta, float(2 * f) / float(r));
        const double ang = double(start + t) * double(inv);
        const double xi = x[(t * h + hh) * d + i];
        const double rot = i < r / 2 ? -double(x[(t * h + hh) * d + i + r / 2]) : double(x[(t * h + hh) * d + i - r / 2]);
        y[(t * h + hh) * d + i] = xi * std::cos(ang) + rot * std::sin(ang);
      }
  return y;
}

TEST(Rope, MatchesRotateHalfWithPartialRotaryAndOffset) {
  const int64_t s = 13, h = 3, d = 16;
  for (const int64_t r : {int64_t(16), int64_t(4)}) {
    RopeOptions o;
    o.rotary_dim = r;
    o.theta = r == 4 ? 1e7f : 10000.0f;
    o.start = 1000;
    const auto x = lcplan::test::randn(size_t(s * h * d), 21);
    std::vector<float> y(x.size());
    rope_forward_cpu(s, h, d, x.data(), y.data(), o);
    EXPECT_TRUE(check_close("rope", y, rope_hf(x, s, h, d, r, o.theta, o.start), 1e-6, 1e-6));
    for (int64_t t = 0; t < s * h; ++t)  // untouched tail
      for (int64_t i = r; i < d; ++i) ASSERT_EQ(y[t * d + i], x[t * d + i]);
    // In place gives the same bits.
    std::vector<float> z = x;
    rope_forward_cpu(s, h, d, z.data(), z.data(), o);
    EXPECT_TRUE(check_close("rope in place", z, y, 0.0, 0.0));
    // A later slice with start + i equals the same rows of the whole sequence.
    RopeOptions later = o;
    later.start = o.start + 5;
    std::vector<float> part(size_t((s - 5) * h * d));
    rope_forward_cpu(s - 5, h, d, x.data() + 5 * h * d, part.data(), later);
    EXPECT_TRUE(check_close("rope slice", part.data(), y.data() + 5 * h * d, part.size(), 0.0, 0.0));
  }
}

TEST(Rope, BackwardIsTheTransposeAndTheInverse) {
  const int64_t s = 9, h = 2, d = 12;
  RopeOptions o;
  o.rotary_dim = 8;
  o.start = 77;
  const auto x = lcplan::test::randn(size_t(s * h * d), 22), g = lcplan::test::randn(size_t(s * h * d), 23);
  std::vector<float> y(x.size()), back(x.size()), gx(x.size());
  rope_forward_cpu(s, h, d, x.data(), y.data(), o);
  rope_backward_cpu(s, h, d, y.data(), back.data(), o);
  EXPECT_TRUE(check_close("rope^-1 rope x", back, x, 1e-6, 1e-6));
  rope_backward_cpu(s, h, d, g.data(), gx.data(), o);
  double lhs = 0, rhs = 0;  // <g, R x> == <R^T g, x>
  for (size_t i = 0; i < x.size(); ++i) lhs += double(g[i]) * y[i], rhs += double(gx[i]) * x[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * (std::fabs(lhs) + 1));
}

}  // namespace
}  // namespace lcplan::attention
