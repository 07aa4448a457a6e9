#include "tune/refit.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lcplan {

namespace {

double mean_abs_residual(const FitResult& r) {
  double s = 0;
  for (const FitPoint& p : r.points) s += std::abs(p.residual());
  return r.points.empty() ? 0 : s / double(r.points.size());
}

}  // namespace

FitResult refit_for_tune(std::vector<MeasuredCase> cases, const Calibration& current, const Calibration& start,
                         const TuneRefitOptions& opt) {
  // Step times only: a tune ranks by speed.
  for (MeasuredCase& c : cases) c.meas.peak_bytes.reset(), c.meas.tflops_per_gpu.reset();
  Calibration priors = start;
  for (const std::string& k : opt.keys) priors.log_sigma[k] = opt.prior_width;
  FitOptions fo;
  fo.spec.model_error = opt.model_error;
  fo.source = opt.source;
  fo.leave_one_out = false;
  const size_t most = std::min(opt.keys.size(), std::max<size_t>(1, cases.size() / 2));
  std::vector<std::string> chosen;
  FitResult best_fit;
  while (chosen.size() < most) {
    double best = std::numeric_limits<double>::infinity();
    std::string best_key;
    for (const std::string& k : opt.keys) {
      if (std::find(chosen.begin(), chosen.end(), k) != chosen.end()) continue;
      fo.spec.keys = chosen;
      fo.spec.keys.push_back(k);
      FitResult r = fit_calibration(cases, current, priors, fo);
      const double e = mean_abs_residual(r);
      if (e < best) best = e, best_key = k, best_fit = std::move(r);
    }
    chosen.push_back(best_key);
  }
  return best_fit;
}

}  // namespace lcplan
