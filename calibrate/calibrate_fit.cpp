#include "calibrate/calibrate_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <Eigen/Dense>

#include "estimator/memory_model.h"
#include "estimator/time_model.h"
#include "common/user_error.h"

namespace lcplan {

const char* to_string(Quantity q) {
  switch (q) {
    case Quantity::PeakBytes: return "peak_bytes";
    case Quantity::StepSeconds: return "step_seconds";
    case Quantity::TflopsPerGpu: return "tflops_per_gpu";
  }
  return "?";
}

double predict(const MeasuredCase& c, Quantity q, const Calibration& cal) {
  const Plan& p = c.meas.plan;
  switch (q) {
    case Quantity::PeakBytes: return estimate_memory(c.model, p, c.hw, cal).peak_bytes;
    case Quantity::StepSeconds:
      if (c.meas.scope == MeasurementScope::MoeLayer) {
        const MoeLayerTime t = moe_layer_time(derive_plan(c.model, p, c.hw), c.hw, cal);
        return t.forward + t.backward;
      }
      return estimate_time(c.model, p, c.hw, cal).step_seconds;
    case Quantity::TflopsPerGpu: return estimate_time(c.model, p, c.hw, cal).tflops_per_gpu;
  }
  return 0;
}

namespace {

struct Datum {
  size_t case_index;
  Quantity q;
  double measured;
};

std::vector<Datum> data_of(const std::vector<MeasuredCase>& cases) {
  std::vector<Datum> d;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Measurement& m = cases[i].meas;
    if (m.peak_bytes) d.push_back({i, Quantity::PeakBytes, *m.peak_bytes});
    if (m.step_seconds) d.push_back({i, Quantity::StepSeconds, *m.step_seconds});
    if (m.tflops_per_gpu) d.push_back({i, Quantity::TflopsPerGpu, *m.tflops_per_gpu});
  }
  return d;
}

struct Param {
  const CoefficientInfo* info;
  double scale;  // coefficients are fitted in units of their starting value (or of their range)
};

void set(Calibration& cal, const std::vector<Param>& ps, const Eigen::VectorXd& x) {
  for (size_t k = 0; k < ps.size(); ++k) cal.*(ps[k].info->member) = x[k] * ps[k].scale;
}

Eigen::VectorXd clamp(const std::vector<Param>& ps, Eigen::VectorXd x) {
  for (size_t k = 0; k < ps.size(); ++k) x[k] = std::clamp(x[k], ps[k].info->lo / ps[k].scale, ps[k].info->hi / ps[k].scale);
  return x;
}

// Relative residual, or under the pseudo-Huber loss the signed square root of 2*rho(r) (quadratic below delta,
// linear above), so that Levenberg-Marquardt on these values minimises sum rho(r) (Hartley & Zisserman, A6.8).
Eigen::VectorXd residuals(const std::vector<MeasuredCase>& cases, const std::vector<Datum>& data, const Calibration& cal,
                          double huber_delta) {
  Eigen::VectorXd r(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const double e = predict(cases[data[i].case_index], data[i].q, cal) / data[i].measured - 1;
    if (huber_delta <= 0) {
      r[i] = e;
    } else {
      const double d = huber_delta, rho = d * d * (std::sqrt(1 + (e / d) * (e / d)) - 1);
      r[i] = std::copysign(std::sqrt(2 * rho), e);
    }
  }
  return r;
}

// Levenberg-Marquardt on relative residuals, numerical Jacobian, bounds by projection.
Calibration lm_fit(const std::vector<MeasuredCase>& cases, const std::vector<Datum>& data, const Calibration& start,
                   const std::vector<Param>& ps, int max_iter, double huber_delta, int* iterations) {
  const int n = int(ps.size());
  Calibration cal = start;
  Eigen::VectorXd x(n);
  for (int k = 0; k < n; ++k) x[k] = start.*(ps[k].info->member) / ps[k].scale;
  x = clamp(ps, x);
  set(cal, ps, x);
  Eigen::VectorXd r = residuals(cases, data, cal, huber_delta);
  double cost = r.squaredNorm();
  double lambda = 1e-3;
  int it = 0;
  bool converged = false;
  for (; it < max_iter && !converged; ++it) {
    Eigen::MatrixXd J(r.size(), n);
    for (int k = 0; k < n; ++k) {
      // Central-ish difference, stepping inward at a bound.
      const double h = 1e-4 * std::max(1.0, std::abs(x[k]));
      Eigen::VectorXd xp = x;
      xp[k] += h;
      if (xp[k] * ps[k].scale > ps[k].info->hi) xp[k] = x[k] - h;
      Calibration cp = cal;
      set(cp, ps, xp);
      J.col(k) = (residuals(cases, data, cp, huber_delta) - r) / (xp[k] - x[k]);
    }
    const Eigen::MatrixXd A = J.transpose() * J;
    const Eigen::VectorXd g = J.transpose() * r;
    bool improved = false;
    for (int tries = 0; tries < 12 && !improved; ++tries) {
      Eigen::MatrixXd M = A;
      for (int k = 0; k < n; ++k) M(k, k) += lambda * (A(k, k) + 1e-9);
      const Eigen::VectorXd step = M.ldlt().solve(-g);
      const Eigen::VectorXd xn = clamp(ps, x + step);
      Calibration cn = cal;
      set(cn, ps, xn);
      const Eigen::VectorXd rn = residuals(cases, data, cn, huber_delta);
      const double cn_cost = rn.allFinite() ? rn.squaredNorm() : std::numeric_limits<double>::infinity();
      if (cn_cost < cost) {
        const double gain = cost - cn_cost;
        x = xn;
        cal = cn;
        r = rn;
        cost = cn_cost;
        lambda = std::max(lambda / 3, 1e-9);
        improved = true;
        converged = gain < 1e-10 * (1 + cost);
      } else {
        lambda *= 4;
      }
    }
    if (!improved) break;
  }
  if (iterations) *iterations = it;
  return cal;
}

double mape(const std::vector<double>& errs) {
  double s = 0;
  int n = 0;
  for (double e : errs)
    if (std::isfinite(e)) s += std::abs(e), ++n;
  return n ? s / n : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

FitResult fit_calibration(const std::vector<MeasuredCase>& cases, const Calibration& start, const FitOptions& opt) {
  std::vector<Param> ps;
  const auto& table = coefficient_table();
  auto add = [&](const CoefficientInfo& info) {
    const double v = start.*(info.member);
    const double scale = v > 0 ? v : std::max(1e-12, (std::min(info.hi, 1e6) - info.lo) * 0.01);
    ps.push_back({&info, scale});
  };
  if (opt.keys.empty()) {
    for (const auto& info : table)
      if (info.fittable) add(info);
  } else {
    for (const std::string& key : opt.keys) {
      const CoefficientInfo* found = nullptr;
      for (const auto& info : table)
        if (key == info.key) found = &info;
      if (!found) throw UserError("--fit names unknown coefficient \"" + key + "\" (see the keys in a calibration file)");
      if (!found->fittable) throw UserError("coefficient \"" + key + "\" is not fittable (it is a published or derived constant)");
      add(*found);
    }
  }
  const std::vector<Datum> data = data_of(cases);
  if (ps.size() > data.size())
    throw UserError("cannot fit " + std::to_string(ps.size()) + " free coefficients to " + std::to_string(data.size()) +
                    " measured values (give at least as many measured values as coefficients, or fewer --fit keys)");

  FitResult res;
  for (const Param& p : ps) res.keys.push_back(p.info->key);
  res.calibration = lm_fit(cases, data, start, ps, opt.max_iterations, opt.huber_delta, &res.iterations);
  const std::string prov = "fitted: " + std::to_string(data.size()) + " points" + (opt.source.empty() ? "" : " from " + opt.source);
  for (const Param& p : ps) res.calibration.provenance[p.info->key] = prov;

  std::vector<double> before, after, loo;
  for (const Datum& d : data) {
    FitPoint fp;
    fp.id = cases[d.case_index].meas.id;
    fp.quantity = d.q;
    fp.measured = d.measured;
    fp.predicted_before = predict(cases[d.case_index], d.q, start);
    fp.predicted = predict(cases[d.case_index], d.q, res.calibration);
    fp.loo_predicted = std::numeric_limits<double>::quiet_NaN();
    res.points.push_back(fp);
    before.push_back(fp.predicted_before / fp.measured - 1);
    after.push_back(fp.residual());
  }
  if (opt.leave_one_out) {
    // Honest leave-one-out: refit from the same start without measurement i, then predict its values.
    for (size_t i = 0; i < cases.size(); ++i) {
      std::vector<MeasuredCase> rest;
      for (size_t j = 0; j < cases.size(); ++j)
        if (j != i) rest.push_back(cases[j]);
      const std::vector<Datum> rest_data = data_of(rest);
      if (rest_data.size() < ps.size()) continue;
      const Calibration cal_i = lm_fit(rest, rest_data, start, ps, opt.max_iterations, opt.huber_delta, nullptr);
      for (size_t k = 0; k < data.size(); ++k)
        if (data[k].case_index == i) res.points[k].loo_predicted = predict(cases[i], data[k].q, cal_i);
    }
  }
  for (const FitPoint& fp : res.points) loo.push_back(fp.loo_error());
  res.mape_before = mape(before);
  res.mape = mape(after);
  res.loo_mape = mape(loo);
  return res;
}

std::string fit_report(const FitResult& r) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %-14s %12s %12s %9s %12s %9s\n", "id", "quantity", "measured", "predicted",
                "residual", "loo_pred", "loo_err");
  out += line;
  for (const FitPoint& p : r.points) {
    const double scale = p.quantity == Quantity::PeakBytes ? 1e-9 : 1.0;  // GB for memory, as given otherwise
    if (std::isfinite(p.loo_predicted))
      std::snprintf(line, sizeof line, "%-28s %-14s %12.4g %12.4g %8.1f%% %12.4g %8.1f%%\n", p.id.c_str(),
                    to_string(p.quantity), p.measured * scale, p.predicted * scale, 100 * p.residual(),
                    p.loo_predicted * scale, 100 * p.loo_error());
    else  // leave-one-out skipped (--no-loo)
      std::snprintf(line, sizeof line, "%-28s %-14s %12.4g %12.4g %8.1f%% %12s %9s\n", p.id.c_str(),
                    to_string(p.quantity), p.measured * scale, p.predicted * scale, 100 * p.residual(), "-", "-");
    out += line;
  }
  if (std::isfinite(r.loo_mape))
    std::snprintf(line, sizeof line, "MAPE: start %.1f%%, fitted %.1f%%, leave-one-out %.1f%% (%zu coefficients, %d iterations)\n",
                  100 * r.mape_before, 100 * r.mape, 100 * r.loo_mape, r.keys.size(), r.iterations);
  else
    std::snprintf(line, sizeof line, "MAPE: start %.1f%%, fitted %.1f%% (%zu coefficients, %d iterations)\n",
                  100 * r.mape_before, 100 * r.mape, r.keys.size(), r.iterations);
  out += line;
  out += "fitted:";
  for (const auto& k : r.keys) {
    std::snprintf(line, sizeof line, " %s", k.c_str());
    out += line;
  }
  out += "\n";
  return out;
}

}  // namespace lcplan
