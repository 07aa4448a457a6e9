// Least-squares fits of the estimator's curves to measured points (pure functions):
//  - the saturating efficiency curve eff(x) = max * x / (x + half) (estimator/time_model.cpp efficiency_curve),
//  - the alpha-beta collective model t = alpha + x / bandwidth, with x = bytes x the nccl-tests bus factor
//    (estimator/time_model.cpp collective_seconds),
//  - medians of repeats.
#pragma once

#include <vector>

namespace lcplan::profiler {

struct CurveFit {
  double max = 0;       // efficiency at large x
  double half = 0;      // x at which the efficiency is max / 2
  double rms = 0;       // root-mean-square residual (efficiency units)
  int points = 0;
};

// Minimizes sum (y_i - max x_i / (x_i + half))^2 over max in (0, max_cap] and half in [0, half_cap]. For a fixed
// half the best max has a closed form (clipped to max_cap, which is optimal for a 1-D quadratic); half is found by
// a log-spaced scan refined by golden-section search. Needs at least one point with x > 0; throws
// std::invalid_argument otherwise, or when x and y differ in length.
CurveFit fit_saturating(const std::vector<double>& x, const std::vector<double>& y, double max_cap = 1.0,
                        double half_cap = 65536);

struct AlphaBetaFit {
  double alpha = 0;      // seconds per call
  double bandwidth = 0;  // bytes (x units) per second
  double rms_rel = 0;    // root-mean-square relative residual
  int points = 0;
};

// Weighted least squares of t = alpha + x / bandwidth with weights 1/t^2 (relative error, so the small messages
// that set alpha and the large ones that set the bandwidth count alike), alpha >= 0. Needs two points of different
// x; throws std::invalid_argument otherwise or when the fitted slope is not positive.
AlphaBetaFit fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t);

// Median (mean of the middle two for an even count); 0 for an empty vector.
double median(std::vector<double> v);

}  // namespace lcplan::profiler
