// The profile's fits recover known parameters: the saturating efficiency curve (max, half) and the alpha-beta line
// of a collective (latency, bandwidth), exactly from exact points and closely from noisy ones.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "profiler/fit.h"

namespace lcplan::profiler {
namespace {

// Deterministic +-amp noise.
double wobble(size_t i, double amp) { return 1 + amp * std::sin(12.9898 * double(i + 1)); }

TEST(CurveFit, RecoversMaxAndHalfFromExactPoints) {
  std::vector<double> x, y;
  for (double t = 16; t <= 32768; t *= 2) x.push_back(t), y.push_back(0.7 * t / (t + 300));
  const CurveFit f = fit_saturating(x, y);
  EXPECT_NEAR(f.max, 0.7, 1e-4);
  EXPECT_NEAR(f.half, 300, 0.5);
  EXPECT_LT(f.rms, 1e-6);
  EXPECT_EQ(f.points, int(x.size()));
}

TEST(CurveFit, RecoversFromNoisyPoints) {
  std::vector<double> x, y;
  for (double t = 8; t <= 65536; t *= 1.5) x.push_back(t), y.push_back(0.45 * t / (t + 1200) * wobble(x.size(), 0.02));
  const CurveFit f = fit_saturating(x, y);
  EXPECT_NEAR(f.max, 0.45, 0.45 * 0.05);
  EXPECT_NEAR(f.half, 1200, 1200 * 0.15);
}

TEST(CurveFit, FlatDataGivesHalfZero) {
  const CurveFit f = fit_saturating({64, 256, 1024}, {0.5, 0.5, 0.5});
  EXPECT_NEAR(f.max, 0.5, 1e-9);
  EXPECT_NEAR(f.half, 0, 1e-3);
}

TEST(CurveFit, CapsRespected) {
  // Points still rising steeply at the largest x: unconstrained max would exceed 1.
  std::vector<double> x, y;
  for (double t = 16; t <= 1024; t *= 2) x.push_back(t), y.push_back(2.0 * t / (t + 5000));
  const CurveFit f = fit_saturating(x, y, 1.0, 65536);
  EXPECT_LE(f.max, 1.0);
  EXPECT_LE(f.half, 65536);
}

TEST(CurveFit, BadInput) {
  EXPECT_THROW(fit_saturating({}, {}), std::invalid_argument);
  EXPECT_THROW(fit_saturating({0}, {0.5}), std::invalid_argument);
  EXPECT_THROW(fit_saturating({1, 2}, {0.5}), std::invalid_argument);
}

TEST(AlphaBeta, RecoversLatencyAndBandwidth) {
  std::vector<double> x, t;
  for (double b = 1024; b <= (1 << 30); b *= 4) x.push_back(b), t.push_back(20e-6 + b / 150e9);
  const AlphaBetaFit f = fit_alpha_beta(x, t);
  EXPECT_NEAR(f.alpha, 20e-6, 1e-9);
  EXPECT_NEAR(f.bandwidth, 150e9, 150e9 * 1e-6);
  EXPECT_LT(f.rms_rel, 1e-9);
}

TEST(AlphaBeta, RecoversFromNoisyPoints) {
  std::vector<double> x, t;
  for (double b = 4096; b <= (1 << 28); b *= 2) x.push_back(b), t.push_back((8e-6 + b / 40e9) * wobble(x.size(), 0.03));
  const AlphaBetaFit f = fit_alpha_beta(x, t);
  EXPECT_NEAR(f.alpha, 8e-6, 8e-6 * 0.1);
  EXPECT_NEAR(f.bandwidth, 40e9, 40e9 * 0.05);
}

TEST(AlphaBeta, NegativeInterceptIsClippedToZero) {
  // Times below a line through the origin at small sizes: alpha would come out negative.
  const AlphaBetaFit f = fit_alpha_beta({1e3, 1e6, 1e9}, {1e-9, 1e-5, 1e-2});
  EXPECT_EQ(f.alpha, 0);
  EXPECT_GT(f.bandwidth, 0);
}

TEST(AlphaBeta, BadInput) {
  EXPECT_THROW(fit_alpha_beta({1e3}, {1e-5}), std::invalid_argument);
  EXPECT_THROW(fit_alpha_beta({1e3, 1e3}, {1e-5, 2e-5}), std::invalid_argument);
  EXPECT_THROW(fit_alpha_beta({1e3, 1e6}, {1e-3, 1e-6}), std::invalid_argument);  // shrinking with size
  EXPECT_THROW(fit_alpha_beta({1e3, 1e6}, {0, 1e-6}), std::invalid_argument);
}

TEST(Median, OddEvenEmpty) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
}

}  // namespace
}  // namespace lcplan::profiler
