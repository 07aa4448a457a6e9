// Linear CE on the CPU: shared math, fp32 and bf16 paths against an fp64 reference, edge cases, memory (scratch meter
// and every heap byte), bad input, and the vocabulary-parallel combine driven through its cross-rank hook by threads
// (MPI is in its own test).
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include "tests/linear_ce/heap_counter.h"
#include "tests/linear_ce/reference.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::error_of;
using test::expect_bf16_close;
using test::expect_rel;
using test::log_add_exp;
using test::make_data;
using test::odd_tiles;
using test::reference;
using test::run_cpu;
using test::run_naive;

constexpr double kF32Rtol = 1e-5;

void expect_f32_matches(const Data& d, const Options& o, const test::Outputs& ours) {
  const auto ref = reference(d, o);
  expect_rel("loss", ours.loss, ref.loss, kF32Rtol);
  expect_rel("lse", ours.lse, ref.lse, kF32Rtol);
  expect_rel("d_hidden", ours.dh, ref.dh, kF32Rtol);
  expect_rel("d_weight", ours.dw, ref.dw, kF32Rtol);
}

// ---- shared math ----

TEST(LinearCeMath, Bf16RoundTripsEveryFinitePattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const bf16 x{static_cast<uint16_t>(b)};
    const float f = bf16_to_float(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << b;
      continue;
    }
    ASSERT_EQ(float_to_bf16(f).bits, x.bits) << "pattern " << b;
  }
}

TEST(LinearCeMath, Bf16RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing at 1.0
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + ulp / 2)), 1.0f);                 // tie -> even (down)
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.5f * ulp)), 1.0f + 2 * ulp);     // tie -> even (up)
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0.6f * ulp)), 1.0f + ulp);         // above half rounds up
  EXPECT_EQ(bf16_to_float(float_to_bf16(-1.0f - 0.4f * ulp)), -1.0f);             // below half rounds down
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(-0.0f))));
}

TEST(LinearCeMath, OnlineMergeMatchesDirectLogSumExp) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 30.0f);  // wide spread: exp would overflow without the running max
  std::vector<float> xs(1000);
  for (auto& x : xs) x = nd(rng) + 60.0f;
  double mx = -INFINITY;
  for (float x : xs) mx = std::max(mx, double(x));
  double se = 0;
  for (float x : xs) se += std::exp(double(x) - mx);
  const double direct = mx + std::log(se);
  // Three different groupings of the same stream must agree with the direct value.
  LseState one = lse_empty();
  for (float x : xs) one = lse_push(one, x);
  LseState a = lse_empty(), b = lse_empty();
  for (size_t i = 0; i < xs.size(); ++i) (i % 3 ? a : b) = lse_push(i % 3 ? a : b, xs[i]);
  float lae = -INFINITY;
  for (float x : xs) lae = log_add_exp(lae, x);
  EXPECT_NEAR(lse_value(one), direct, 1e-5 * std::fabs(direct));
  EXPECT_NEAR(lse_value(lse_merge(a, b)), direct, 1e-5 * std::fabs(direct));
  EXPECT_NEAR(lae, direct, 1e-5 * std::fabs(direct));
}

TEST(LinearCeMath, EmptyStatesAndInfinitiesAreSafe) {
  EXPECT_EQ(lse_value(lse_empty()), -INFINITY);
  EXPECT_EQ(log_add_exp(-INFINITY, -INFINITY), -INFINITY);
  EXPECT_EQ(log_add_exp(-INFINITY, 3.0f), 3.0f);
  EXPECT_NEAR(log_add_exp(1000.0f, 1000.0f), 1000.0f + std::log(2.0f), 1e-3);
  const LseState s = lse_merge(lse_empty(), LseState{2.0f, 3.0f});
  EXPECT_EQ(s.m, 2.0f);
  EXPECT_EQ(s.s, 3.0f);
  EXPECT_EQ(lse_rescale(0.0f, -INFINITY, 5.0f), 0.0f);
}

// ---- fp32 and bf16 against fp64 ----

class Reductions : public ::testing::TestWithParam<Reduction> {};

TEST_P(Reductions, Fp32OddShapesMatchFp64) {
  const Data d = make_data(252, 507, 1231, DType::F32, 11);
  const Options o = odd_tiles(GetParam());
  expect_f32_matches(d, o, run_cpu(d, o));
}

TEST_P(Reductions, NaiveFp32BaselineMatchesFp64) {
  const Data d = make_data(64, 96, 300, DType::F32, 12);
  const Options o = odd_tiles(GetParam());
  expect_f32_matches(d, o, run_naive(d, o));
}

TEST_P(Reductions, Bf16NoWorseThanNaiveBf16) {
  const Data d = make_data(252, 507, 1231, DType::BF16, 13);
  const Options o = odd_tiles(GetParam());
  expect_bf16_close(run_cpu(d, o), run_naive(d, o), reference(d, o));
}

INSTANTIATE_TEST_SUITE_P(LinearCe, Reductions, ::testing::Values(Reduction::None, Reduction::Mean, Reduction::Sum),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(LinearCe, SoftcapAndZLossMatchFp64) {
  const Data d = make_data(60, 130, 517, DType::F32, 14, 0.1, 6.0);
  Options o = odd_tiles(Reduction::Sum);
  o.softcap = 5.0f;
  o.z_loss = 1e-3f;
  expect_f32_matches(d, o, run_cpu(d, o));
}

TEST(LinearCe, LargeLogitsStayFinite) {
  const Data d = make_data(40, 64, 700, DType::F32, 15, 0.1, 80.0);  // |logits| ~ 100s: exp overflows unshifted
  const Options o = odd_tiles(Reduction::Mean);
  const auto ours = run_cpu(d, o);
  for (float x : ours.lse) ASSERT_TRUE(std::isfinite(x));
  // fp32 logits of size ~300 carry ~300x more absolute rounding than size-1 ones, and exp() turns that into
  // relative error of the probabilities, so this stress case gets 1e-4 instead of 1e-5.
  const auto ref = reference(d, o);
  expect_rel("loss", ours.loss, ref.loss, 1e-5);
  expect_rel("d_hidden", ours.dh, ref.dh, 1e-4);
  expect_rel("d_weight", ours.dw, ref.dw, 1e-4);
}

TEST(LinearCe, ExtremeTilingStillMatches) {
  const Data d = make_data(9, 17, 23, DType::F32, 16);
  Options o;
  o.reduction = Reduction::Sum;
  o.vocab_tile = 1;
  o.token_tile = 1;
  expect_f32_matches(d, o, run_cpu(d, o));
}

TEST(LinearCe, AllTargetsIgnoredGivesZeroLossAndGradients) {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    const Data d = make_data(33, 40, 257, DType::F32, 17, /*ignore_frac=*/1.1);
    const Options o = odd_tiles(r);
    const auto ours = run_cpu(d, o);
    for (float x : ours.loss) EXPECT_EQ(x, 0.0f) << to_string(r);
    for (float x : ours.lse) EXPECT_TRUE(std::isfinite(x));
    for (float x : ours.dh) ASSERT_EQ(x, 0.0f) << to_string(r);
    for (float x : ours.dw) ASSERT_EQ(x, 0.0f) << to_string(r);
    expect_f32_matches(d, o, ours);
  }
}

TEST(LinearCe, OneToken) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Data d = make_data(1, 77, 301, t, 18, 0.0);
    const Options o = odd_tiles(Reduction::Mean);
    const auto ours = run_cpu(d, o);
    if (t == DType::F32) expect_f32_matches(d, o, ours);
    else expect_bf16_close(ours, run_naive(d, o), reference(d, o));
  }
}

TEST(LinearCe, VocabSmallerThanOneTile) {
  const Data d = make_data(50, 33, 37, DType::F32, 19);
  Options o;
  o.vocab_tile = 2048;
  o.reduction = Reduction::Mean;
  expect_f32_matches(d, o, run_cpu(d, o));
}

TEST(LinearCe, ZeroTokensIsANoOp) {
  const Data d = make_data(0, 8, 16, DType::F32, 20);
  const auto ours = run_cpu(d, Options{});
  EXPECT_EQ(ours.loss[0], 0.0f);
  for (float x : ours.dw) EXPECT_EQ(x, 0.0f);
}

// ---- memory ----

TEST(LinearCe, ExtraMemoryIsIndependentOfVocabulary) {
  for (DType t : {DType::F32, DType::BF16}) {
    Options o;
    o.vocab_tile = 128;
    o.token_tile = 64;
    const int64_t n = 200, h = 48;
    const size_t bound = cpu_extra_bytes_bound(n, h, t, o);
    size_t naive_prev = 0;
    for (int64_t v : {1024, 4096, 16384}) {
      const Data d = make_data(n, h, v, t, 21);
      const auto ours = run_cpu(d, o);
      const auto naive = run_naive(d, o);
      EXPECT_GT(ours.fwd_stats.peak_extra_bytes, 0u);
      EXPECT_LE(ours.fwd_stats.peak_extra_bytes, bound) << "V=" << v;
      EXPECT_LE(ours.bwd_stats.peak_extra_bytes, bound) << "V=" << v;
      // The naive baseline holds the [N x V] logits, so it grows with V and overtakes the bound.
      EXPECT_GE(naive.fwd_stats.peak_extra_bytes, size_t(n * v) * sizeof(float));
      EXPECT_GT(naive.bwd_stats.peak_extra_bytes, naive_prev);
      naive_prev = naive.bwd_stats.peak_extra_bytes;
    }
    EXPECT_GT(naive_prev, 10 * bound) << to_string(t);
  }
}

TEST(LinearCe, MeasuredPeakIsTheSameForEveryVocabAboveOneTile) {
  Options o;
  o.vocab_tile = 64;
  const auto a = run_cpu(make_data(30, 20, 640, DType::BF16, 22), o);
  const auto b = run_cpu(make_data(30, 20, 6400, DType::BF16, 22), o);
  EXPECT_EQ(a.fwd_stats.peak_extra_bytes, b.fwd_stats.peak_extra_bytes);
  EXPECT_EQ(a.bwd_stats.peak_extra_bytes, b.bwd_stats.peak_extra_bytes);
}

// The scratch meter only sees what the implementation chose to meter; this counts every heap byte (malloc family:
// operator new and Eigen's std::malloc alike), so a stray O(tokens x vocab) temporary would show up here.
TEST(LinearCe, HeapPeakIsIndependentOfVocabulary) {
  if (!test::heap_counting()) GTEST_SKIP() << "malloc is not interposed in this build (sanitizer or non-glibc)";
  {
    // The counter must see an Eigen temporary, or this test could not catch one.
    Eigen::MatrixXf a = Eigen::MatrixXf::Ones(64, 64);
    test::HeapWindow w;
    Eigen::MatrixXf b = a * a;
    EXPECT_GE(w.peak(), sizeof(float) * 64 * 64);
    EXPECT_EQ(b(0, 0), 64.0f);
  }
  for (DType t : {DType::F32, DType::BF16}) {
    Options o;
    o.vocab_tile = 128;
    o.token_tile = 64;
    const int64_t n = 200, h = 48, nt = o.token_tile, vt = o.vocab_tile;
    // Unmetered but vocabulary-independent: Eigen's GEMM packing buffers (at most the operands of one tile GEMM)
    // and allocator rounding.
    const size_t slack = sizeof(float) * static_cast<size_t>(nt * vt + nt * h + vt * h) + 64 * 1024;
    const size_t limit = cpu_extra_bytes_bound(n, h, t, o) + slack;
    for (int64_t v : {1024, 4096, 16384}) {
      const Data d = make_data(n, h, v, t, 26);
      const size_t es = dtype_bytes(t);
      std::vector<float> loss(1), lse(n);
      std::vector<char> dh(static_cast<size_t>(n * h) * es), dw(static_cast<size_t>(v * h) * es);
      const float one = 1.0f;
      Stats fs, bs;
      size_t fwd_heap = 0, bwd_heap = 0;
      {
        test::HeapWindow w;
        forward_cpu(d.problem(), t, d.hidden(), d.weight(), d.targets.data(), loss.data(), lse.data(), o, &fs);
        fwd_heap = w.peak();
      }
      {
        test::HeapWindow w;
        backward_cpu(d.problem(), t, d.hidden(), d.weight(), d.targets.data(), lse.data(), &one, dh.data(), dw.data(),
                     o, &bs);
        bwd_heap = w.peak();
      }
      EXPECT_GE(fwd_heap, fs.peak_extra_bytes) << "the counter must at least see the metered scratch";
      EXPECT_GE(bwd_heap, bs.peak_extra_bytes);
      EXPECT_LE(fwd_heap, limit) << to_string(t) << " V=" << v;
      EXPECT_LE(bwd_heap, limit) << to_string(t) << " V=" << v;
      size_t naive_heap = 0;
      {
        test::HeapWindow w;
        forward_naive_cpu(d.problem(), t, d.hidden(), d.weight(), d.targets.data(), loss.data(), lse.data(), o);
        naive_heap = w.peak();
      }
      EXPECT_GE(naive_heap, sizeof(float) * static_cast<size_t>(n * v)) << "the counter sees materialised logits";
    }
  }
}

// ---- bad input ----

TEST(LinearCe, BadInputGetsOneClearSentence) {
  const Data d = make_data(4, 8, 16, DType::F32, 23);
  std::vector<float> loss(4), lse(4);
  auto fwd = [&](Problem p, Options o, const int64_t* tg) {
    return error_of([&] { forward_cpu(p, DType::F32, d.hidden(), d.weight(), tg, loss.data(), lse.data(), o); });
  };
  const Options ok;
  EXPECT_NE(fwd(Problem{-1, 8, 16}, ok, d.targets.data()).find("tokens must be >= 0"), std::string::npos);
  EXPECT_NE(fwd(Problem{4, 0, 16}, ok, d.targets.data()).find("hidden must be > 0"), std::string::npos);
  EXPECT_NE(fwd(Problem{4, 8, -3}, ok, d.targets.data()).find("vocab"), std::string::npos);
  Options zero_tile;
  zero_tile.vocab_tile = 0;
  EXPECT_NE(fwd(d.problem(), zero_tile, d.targets.data()).find("vocab_tile must be > 0"), std::string::npos);
  zero_tile = ok;
  zero_tile.token_tile = 0;
  EXPECT_NE(fwd(d.problem(), zero_tile, d.targets.data()).find("token_tile must be > 0"), std::string::npos);
  std::vector<int64_t> bad = d.targets;
  bad[2] = 16;
  const std::string msg = fwd(d.problem(), ok, bad.data());
  EXPECT_NE(msg.find("target[2] = 16 is outside [0, 16)"), std::string::npos) << msg;
  bad[2] = -5;
  EXPECT_NE(fwd(d.problem(), ok, bad.data()).find("target[2] = -5"), std::string::npos);
  EXPECT_NE(fwd(Problem{4, 8, 16, 8, 20}, ok, d.targets.data()).find("does not fit"), std::string::npos);
  Options neg_cap;
  neg_cap.softcap = -1.0f;
  EXPECT_NE(fwd(d.problem(), neg_cap, d.targets.data()).find("softcap"), std::string::npos);
  // A shard without a cross-rank all-reduce would be a partial loss: refused, naming the fields.
  const std::string shard = fwd(Problem{4, 8, 16, 0, 32}, ok, d.targets.data());
  EXPECT_NE(shard.find("vocab_start = 0 and vocab_total = 32"), std::string::npos) << shard;
  EXPECT_NE(shard.find("no cross-rank all-reduce"), std::string::npos) << shard;
  // The naive baseline refuses a shard rather than silently computing a partial loss.
  EXPECT_NE(error_of([&] {
              forward_naive_cpu(Problem{4, 8, 16, 0, 32}, DType::F32, d.hidden(), d.weight(), d.targets.data(),
                                loss.data(), lse.data(), ok);
            }).find("single rank"),
            std::string::npos);
}

TEST(LinearCe, CustomIgnoreIndexIsHonoured) {
  Data d = make_data(40, 24, 90, DType::F32, 24, 0.0);
  for (int64_t i = 0; i < d.n; i += 3) d.targets[i] = 5;  // token 5 is padding here
  Options o = odd_tiles(Reduction::Mean);
  o.ignore_index = 5;
  expect_f32_matches(d, o, run_cpu(d, o));
}

// ---- vocabulary parallelism through the cross-rank hook (threads stand in for ranks) ----

TEST(LinearCe, VocabShardsCombinedThroughHookMatchSingleRank) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Data d = make_data(70, 45, 1231, t, 25);
    Options o = odd_tiles(Reduction::Mean);
    o.softcap = 20.0f;
    o.z_loss = 1e-4f;
    const auto whole = run_cpu(d, o);
    const int ranks = 4;
    const int64_t shard = (d.v + ranks - 1) / ranks;  // uneven last shard
    test::ThreadAllReduce ar(ranks);
    std::vector<test::Outputs> per(ranks);
    std::vector<std::thread> th;
    for (int r = 0; r < ranks; ++r) {
      th.emplace_back([&, r] {
        const int64_t start = r * shard, size = std::min(shard, d.v - start);
        const Problem p{d.n, d.h, size, start, d.v};
        const size_t es = dtype_bytes(t);
        const void* w = static_cast<const char*>(d.weight()) + start * d.h * es;
        auto& out = per[r];
        out.loss.assign(1, 0.0f);
        out.lse.assign(d.n, 0.0f);
        forward_cpu(p, t, d.hidden(), w, d.targets.data(), out.loss.data(), out.lse.data(), o, nullptr, ar.hook(r));
        const float one = 1.0f;
        std::vector<char> dh(d.n * d.h * es), dw(size * d.h * es);
        backward_cpu(p, t, d.hidden(), w, d.targets.data(), out.lse.data(), &one, dh.data(), dw.data(), o, nullptr,
                     ar.hook(r));
        out.dh = test::decode(dh, t);
        out.dw = test::decode(dw, t);
      });
    }
    for (auto& x : th) x.join();
    const double tol = t == DType::F32 ? 1e-5 : 8e-3;  // bf16: one output rounding may land either side
    for (int r = 0; r < ranks; ++r) {
      expect_rel("loss", per[r].loss, test::widen(whole.loss), 1e-5);
      expect_rel("lse", per[r].lse, test::widen(whole.lse), 1e-5);
      expect_rel("d_hidden", per[r].dh, test::widen(whole.dh), tol);
    }
    std::vector<float> dw_cat;
    for (int r = 0; r < ranks; ++r) dw_cat.insert(dw_cat.end(), per[r].dw.begin(), per[r].dw.end());
    expect_rel("d_weight", dw_cat, test::widen(whole.dw), tol);
  }
}

}  // namespace
}  // namespace lcplan::linear_ce
