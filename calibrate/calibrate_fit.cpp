#include "calibrate/calibrate_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include <Eigen/Dense>

#include "common/user_error.h"
#include "estimator/frameworks.h"
#include "estimator/memory_model.h"
#include "estimator/time_model.h"

namespace lcplan {

const char* to_string(Quantity q) {
  switch (q) {
    case Quantity::PeakBytes: return "peak_bytes";
    case Quantity::StepSeconds: return "step_seconds";
    case Quantity::TflopsPerGpu: return "tflops_per_gpu";
  }
  return "?";
}

nlohmann::json fit_spec_to_json(const FitSpec& s) {
  return {{"keys", s.keys},
          {"per_hardware", s.per_hardware},
          {"per_implementation", s.per_implementation},
          {"huber_delta", s.huber_delta},
          {"model_error", s.model_error},
          {"hardware_log_sigma", s.hardware_log_sigma},
          {"identified_ratio", s.identified_ratio}};
}

FitSpec fit_spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw UserError("calibration \"fit\" must be an object (keys, per_hardware, per_implementation, ...)");
  FitSpec s;
  for (const auto& item : j.items()) {
    // Named copies: clang 14 cannot capture structured bindings in lambdas.
    const std::string& k = item.key();
    const nlohmann::json& v = item.value();
    auto list = [&](std::vector<std::string>& out) {
      if (!v.is_array()) throw UserError("calibration fit." + k + " must be a list of coefficient keys");
      for (const auto& e : v) {
        if (!e.is_string()) throw UserError("calibration fit." + k + " must be a list of coefficient keys");
        out.push_back(e.get<std::string>());
      }
    };
    auto number = [&](double& out, double lo, double hi) {
      if (!v.is_number() || !(v.get<double>() >= lo) || !(v.get<double>() <= hi))
        throw UserError("calibration fit." + k + " must be a number from " + std::to_string(lo) + " to " + std::to_string(hi));
      out = v.get<double>();
    };
    if (k == "keys") list(s.keys);
    else if (k == "per_hardware") list(s.per_hardware);
    else if (k == "per_implementation") list(s.per_implementation);
    else if (k == "huber_delta") number(s.huber_delta, 0, 1);
    else if (k == "model_error") number(s.model_error, 1e-3, 10);
    else if (k == "hardware_log_sigma") number(s.hardware_log_sigma, 1e-3, 10);
    else if (k == "identified_ratio") number(s.identified_ratio, 0.01, 1);
    else
      throw UserError("calibration \"fit\" has unknown field \"" + k +
                      "\" (valid: keys, per_hardware, per_implementation, huber_delta, model_error, hardware_log_sigma, "
                      "identified_ratio)");
  }
  return s;
}

namespace {

double predict_flat(const MeasuredCase& c, Quantity q, const Calibration& cal) {
  const Plan& p = c.meas.plan;
  switch (q) {
    case Quantity::PeakBytes: {
      if (c.meas.scope == MeasurementScope::MoeLayer) return moe_layer_peak_bytes(derive_plan(c.model, p, c.hw), cal);
      const MemoryEstimate e = estimate_memory(c.model, p, c.hw, cal);
      return c.meas.peak_stage ? e.stages.at(*c.meas.peak_stage).peak_bytes : e.peak_bytes;
    }
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

}  // namespace

double predict(const MeasuredCase& c, Quantity q, const Calibration& profile) {
  return predict_flat(c, q, calibration_for(profile, c.hw, c.meas.plan.implementation));
}

bool fitted_case(const MeasuredCase& c) { return c.meas.superseded_by.empty(); }

namespace {

struct Datum {
  size_t case_index;
  Quantity q;
  double measured;
};

std::vector<Datum> data_of(const std::vector<MeasuredCase>& cases) {
  std::vector<Datum> d;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!fitted_case(cases[i])) continue;
    const Measurement& m = cases[i].meas;
    if (m.peak_bytes && m.memory_not_fitted.empty()) d.push_back({i, Quantity::PeakBytes, *m.peak_bytes});
    if (m.step_seconds) d.push_back({i, Quantity::StepSeconds, *m.step_seconds});
    if (m.tflops_per_gpu) d.push_back({i, Quantity::TflopsPerGpu, *m.tflops_per_gpu});
  }
  return d;
}

enum class Scope { Base, Hardware, Implementation };

struct Param {
  const CoefficientInfo* info;
  Scope scope;
  std::string name;  // hardware or implementation name
  double prior = 0;  // prior value (base and implementation scopes)
  double sigma = 1;  // prior width in log units
  int base = -1;     // hardware scope: the parameter it shrinks toward (the base one of the same key, or its same
                     // chip's override, Hardware::same_chip_as), or -1: the start profile's value for it
  std::string toward = {};  // hardware scope: what it shrinks toward, in words
  bool fixed = false;
};

std::string scope_label(const Param& p) {
  switch (p.scope) {
    case Scope::Base: return "base";
    case Scope::Hardware: return "hardware " + p.name;
    case Scope::Implementation: return "implementation " + p.name;
  }
  return "?";
}

double get(const Calibration& c, const Param& p) {
  const auto* layer = p.scope == Scope::Hardware ? &c.per_hardware : p.scope == Scope::Implementation ? &c.per_implementation : nullptr;
  if (layer) {
    const auto it = layer->find(p.name);
    if (it != layer->end())
      if (auto o = it->second.find(p.info->key); o != it->second.end()) return o->second.value;
  }
  return c.*(p.info->member);
}

void put(Calibration& c, const Param& p, double v, const std::string& provenance) {
  if (p.scope == Scope::Base) {
    c.*(p.info->member) = v;
    c.provenance[p.info->key] = provenance;
    return;
  }
  auto& layer = p.scope == Scope::Hardware ? c.per_hardware : c.per_implementation;
  layer[p.name][p.info->key] = {v, provenance};
}

// Parameters are fitted as theta = ln(value), held inside the coefficient's physical range.
double floor_of(const CoefficientInfo* info) { return std::max(info->lo, 1e-12); }

struct Problem {
  const std::vector<MeasuredCase>& cases;
  std::vector<Datum> data;
  std::vector<Param> params;
  const Calibration& start;
  FitSpec spec;
  std::map<std::string, std::string> same_chip;  // hardware name -> Hardware::same_chip_as, where it names one

  Calibration with(const Eigen::VectorXd& theta) const {
    Calibration c = start;
    for (size_t k = 0; k < params.size(); ++k) put(c, params[k], std::exp(theta[k]), "");
    return c;
  }
  Eigen::VectorXd clamp(Eigen::VectorXd theta) const {
    for (size_t k = 0; k < params.size(); ++k) {
      const CoefficientInfo* info = params[k].info;
      theta[k] = std::clamp(theta[k], std::log(floor_of(info)), std::log(std::min(info->hi, 1e300)));
      if (params[k].fixed) theta[k] = fixed_theta(theta, k);
    }
    return theta;
  }
  // A fixed (unidentified) parameter sits at its prior: the prior value, or a hardware override at what it shrinks
  // toward (the base value, or the same chip's: calibration_for layers them so).
  double fixed_theta(const Eigen::VectorXd& theta, size_t k) const {
    const Param& p = params[k];
    if (p.scope != Scope::Hardware) return std::log(std::max(p.prior, floor_of(p.info)));
    return p.base >= 0 ? theta[p.base] : std::log(std::max(start_value(p), floor_of(p.info)));
  }
  // A hardware override with nothing fitted to shrink toward: the start profile's value for it (its own override,
  // else its same chip's, else the base value: calibration_for's layers).
  double start_value(const Param& p) const {
    const auto chip = same_chip.find(p.name);
    for (const std::string& name : {p.name, chip == same_chip.end() ? std::string() : chip->second})
      if (const auto it = start.per_hardware.find(name); it != start.per_hardware.end())
        if (const auto o = it->second.find(p.info->key); o != it->second.end()) return o->second.value;
    return start.*(p.info->member);
  }
  Eigen::VectorXd residuals(const Eigen::VectorXd& theta) const {
    const Calibration cal = with(theta);
    // One resolved record per (hardware, implementation) pair in the data.
    std::map<std::pair<std::string, std::string>, Calibration> resolved;
    Eigen::VectorXd r(data.size() + params.size());
    for (size_t i = 0; i < data.size(); ++i) {
      const MeasuredCase& c = cases[data[i].case_index];
      const auto key = std::make_pair(c.hw.name, c.meas.plan.implementation);
      auto it = resolved.find(key);
      if (it == resolved.end()) it = resolved.emplace(key, calibration_for(cal, c.hw, key.second)).first;
      const double e = predict_flat(c, data[i].q, it->second) / data[i].measured - 1;
      double v = e;
      if (spec.huber_delta > 0) {  // pseudo-Huber: quadratic below delta, linear above (Hartley & Zisserman, A6.8)
        const double d = spec.huber_delta, rho = d * d * (std::sqrt(1 + (e / d) * (e / d)) - 1);
        v = std::copysign(std::sqrt(2 * rho), e);
      }
      r[i] = v / spec.model_error;
    }
    for (size_t k = 0; k < params.size(); ++k) {
      const Param& p = params[k];
      double center = std::log(std::max(p.prior, floor_of(p.info)));
      if (p.scope == Scope::Hardware)
        center = fixed_theta(theta, k);
      r[data.size() + k] = p.fixed ? 0.0 : (theta[k] - center) / p.sigma;
    }
    return r;
  }
};

Eigen::MatrixXd jacobian(const Problem& pr, const Eigen::VectorXd& theta, const Eigen::VectorXd& r) {
  Eigen::MatrixXd J(r.size(), theta.size());
  for (int k = 0; k < theta.size(); ++k) {
    Eigen::VectorXd tp = theta;
    const double h = 1e-3;
    tp[k] += h;
    tp = pr.clamp(tp);
    double step = tp[k] - theta[k];
    if (std::abs(step) < 1e-12) {  // at the upper bound: step inward
      tp = theta;
      tp[k] -= h;
      step = -h;
    }
    J.col(k) = pr.params[k].fixed ? Eigen::VectorXd::Zero(r.size()) : Eigen::VectorXd((pr.residuals(tp) - r) / step);
  }
  return J;
}

Eigen::VectorXd lm(const Problem& pr, Eigen::VectorXd theta, int max_iter, int* iterations) {
  theta = pr.clamp(theta);
  Eigen::VectorXd r = pr.residuals(theta);
  double cost = r.squaredNorm();
  double lambda = 1e-2;
  int it = 0;
  for (; it < max_iter; ++it) {
    const Eigen::MatrixXd J = jacobian(pr, theta, r);
    const Eigen::MatrixXd A = J.transpose() * J;
    const Eigen::VectorXd g = J.transpose() * r;
    bool improved = false, converged = false;
    for (int tries = 0; tries < 10 && !improved; ++tries) {
      Eigen::MatrixXd M = A;
      for (int k = 0; k < M.rows(); ++k) M(k, k) += lambda * (A(k, k) + 1e-9);
      const Eigen::VectorXd tn = pr.clamp(theta + M.ldlt().solve(-g));
      const Eigen::VectorXd rn = pr.residuals(tn);
      const double cn = rn.allFinite() ? rn.squaredNorm() : std::numeric_limits<double>::infinity();
      if (cn < cost) {
        converged = cost - cn < 1e-9 * (1 + cost);
        theta = tn;
        r = rn;
        cost = cn;
        lambda = std::max(lambda / 3, 1e-9);
        improved = true;
      } else {
        lambda *= 4;
      }
    }
    if (!improved || converged) break;
  }
  if (iterations) *iterations = it;
  return theta;
}

double mean_abs(const std::vector<double>& errs) {
  double s = 0;
  int n = 0;
  for (double e : errs)
    if (std::isfinite(e)) s += std::abs(e), ++n;
  return n ? s / n : std::numeric_limits<double>::quiet_NaN();
}

const CoefficientInfo& fittable(const std::string& key) {
  const CoefficientInfo* info = find_coefficient(key);
  if (!info) throw UserError("unknown coefficient \"" + key + "\" (see the keys in a calibration file)");
  if (!info->fittable) throw UserError("coefficient \"" + key + "\" is not fittable (it is a published or derived constant)");
  return *info;
}

double prior_value(const Calibration& priors, const std::string& key, Scope scope, const std::string& name) {
  if (scope == Scope::Implementation)
    if (auto it = priors.per_implementation.find(name); it != priors.per_implementation.end())
      if (auto o = it->second.find(key); o != it->second.end()) return o->second.value;
  return priors.*(find_coefficient(key)->member);
}

// Each fitted hardware's same chip (Hardware::same_chip_as), where its profile names one.
std::map<std::string, std::string> same_chips(const std::vector<MeasuredCase>& cases, const std::vector<Datum>& data) {
  std::map<std::string, std::string> out;
  for (const Datum& d : data)
    if (const Hardware& hw = cases[d.case_index].hw; !hw.same_chip_as.empty()) out[hw.name] = hw.same_chip_as;
  return out;
}

std::vector<Param> make_params(const std::vector<MeasuredCase>& cases, const std::vector<Datum>& data,
                               const Calibration& priors, const Calibration& start, const FitSpec& spec,
                               const std::map<std::string, std::string>& same_chip) {
  std::set<std::string> hardware, implementations;
  for (const Datum& d : data) {
    hardware.insert(cases[d.case_index].hw.name);
    // The overrides an implementation reads (Megatron-Bridge runs Megatron-LM's kernels: it reads megatron's).
    implementations.insert(calibration_key(cases[d.case_index].meas.plan.implementation));
  }
  std::vector<Param> ps;
  auto sigma_of = [&](const std::string& key) {
    const auto it = priors.log_sigma.find(key);
    if (it == priors.log_sigma.end())
      throw UserError("the prior profile \"" + priors.name + "\" gives no log_sigma for \"" + key +
                      "\" (a fitted coefficient needs a prior width)");
    return it->second;
  };
  for (const std::string& key : spec.keys) {
    const CoefficientInfo& info = fittable(key);
    ps.push_back({&info, Scope::Base, "", prior_value(priors, key, Scope::Base, ""), sigma_of(key)});
  }
  for (const std::string& key : spec.per_implementation) {
    const CoefficientInfo& info = fittable(key);
    for (const std::string& impl : implementations)
      ps.push_back({&info, Scope::Implementation, impl, prior_value(priors, key, Scope::Implementation, impl), sigma_of(key)});
  }
  // A hardware whose same chip is fitted too shrinks toward that chip's override (H200 toward H100: one die), which
  // comes first; one whose chip the start profile has an override for but the data do not, toward that; the others
  // toward the base value.
  std::vector<std::string> order;
  for (int pass = 0; pass < 2; ++pass)
    for (const std::string& hw : hardware) {
      const auto chip = same_chip.find(hw);
      if ((chip != same_chip.end() && hardware.count(chip->second)) == (pass == 1)) order.push_back(hw);
    }
  for (const std::string& key : spec.per_hardware) {
    const CoefficientInfo& info = fittable(key);
    int base = -1;
    for (size_t k = 0; k < ps.size(); ++k)
      if (ps[k].scope == Scope::Base && ps[k].info == &info) base = int(k);
    const size_t first = ps.size();
    for (const std::string& hw : order) {
      Param p{&info, Scope::Hardware, hw, 0, spec.hardware_log_sigma, base, base >= 0 ? "the base value" : "its start value"};
      const auto chip = same_chip.find(hw);
      if (chip != same_chip.end()) {
        const auto held = start.per_hardware.find(chip->second);
        if (held != start.per_hardware.end() && held->second.count(key))
          p.base = -1, p.toward = chip->second + "'s start value (the same chip)";
        for (size_t k = first; k < ps.size(); ++k)
          if (ps[k].name == chip->second) p.base = int(k), p.toward = chip->second + "'s value (the same chip)";
      }
      ps.push_back(p);
    }
  }
  for (const Param& p : ps)
    if (p.scope != Scope::Hardware && !(p.prior > 0))
      throw UserError("coefficient \"" + std::string(p.info->key) + "\" has a prior of 0; a fitted coefficient needs a positive prior");
  return ps;
}

// Fits every free parameter, marks the ones the data do not identify, and refits with those held at their priors.
Eigen::VectorXd solve(Problem& pr, const Calibration& start, int max_iter, int* iterations) {
  Eigen::VectorXd theta(pr.params.size());
  for (size_t k = 0; k < pr.params.size(); ++k)
    theta[k] = std::log(std::max(get(start, pr.params[k]), floor_of(pr.params[k].info)));
  theta = lm(pr, theta, max_iter, iterations);
  // Posterior spread of each parameter (Gauss-Newton covariance of the whole objective) against its prior's.
  const Eigen::VectorXd r = pr.residuals(theta);
  const Eigen::MatrixXd J = jacobian(pr, theta, r);
  const Eigen::MatrixXd C = (J.transpose() * J).ldlt().solve(Eigen::MatrixXd::Identity(theta.size(), theta.size()));
  bool any = false;
  for (size_t k = 0; k < pr.params.size(); ++k) {
    const double spread = std::sqrt(std::max(0.0, C(k, k)));
    if (!(spread < pr.spec.identified_ratio * pr.params[k].sigma)) pr.params[k].fixed = any = true;
  }
  if (!any) return theta;
  const Eigen::VectorXd free_theta = theta;
  theta = lm(pr, theta, max_iter, nullptr);
  // Flat at the optimum is not always uninformed: a time past a floor (launches) stops depending on an efficiency
  // above some value, yet the data reject a prior below it. A fixed parameter whose move, alone, from its prior to
  // its free value lowers the objective by more than the 95% likelihood-ratio bound for one parameter (chi-square
  // 3.84; objective = sum of squared normalized residuals) is one-sidedly identified: it is freed and refitted.
  constexpr double kLikelihoodRatio95 = 3.84;
  const Eigen::VectorXd held_theta = theta;
  const double held = pr.residuals(held_theta).squaredNorm();
  bool freed = false;
  for (size_t k = 0; k < pr.params.size(); ++k) {
    if (!pr.params[k].fixed) continue;
    Eigen::VectorXd moved = held_theta;
    moved[k] = free_theta[k];
    pr.params[k].fixed = false;
    const double d = held - pr.residuals(moved).squaredNorm();
    pr.params[k].fixed = !(d > kLikelihoodRatio95);
    if (!pr.params[k].fixed) theta[k] = free_theta[k], freed = true;  // the refit starts where the data put it
  }
  if (freed) theta = lm(pr, theta, max_iter, nullptr);
  return theta;
}

}  // namespace

FitResult fit_calibration(const std::vector<MeasuredCase>& cases, const Calibration& start, const Calibration& priors,
                          const FitOptions& opt) {
  const std::vector<Datum> data = data_of(cases);
  const std::map<std::string, std::string> same_chip = same_chips(cases, data);
  Problem pr{cases, data, make_params(cases, data, priors, start, opt.spec, same_chip), start, opt.spec, same_chip};
  size_t free_params = pr.params.size();
  if (opt.require_determined && free_params > data.size())
    throw UserError("cannot fit " + std::to_string(free_params) + " free coefficients to " + std::to_string(data.size()) +
                    " measured values (give at least as many measured values as coefficients, or fewer keys)");
  FitResult res;
  const Eigen::VectorXd theta = solve(pr, start, opt.max_iterations, &res.iterations);

  res.calibration = start;
  res.calibration.fit = fit_spec_to_json(opt.spec);
  const std::string from = std::to_string(data.size()) + " points" + (opt.source.empty() ? "" : " from " + opt.source);
  for (size_t k = 0; k < pr.params.size(); ++k) {
    const Param& p = pr.params[k];
    const double prior_v = p.scope == Scope::Hardware ? std::exp(pr.fixed_theta(theta, k)) : p.prior;
    const auto pp = priors.provenance.find(p.info->key);
    const std::string prior_prov = pp == priors.provenance.end() ? "" : pp->second;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.4g", prior_v);
    FittedCoefficient fc{p.info->key, scope_label(p), prior_v, std::exp(theta[k]), !p.fixed};
    if (p.fixed) {
      fc.value = prior_v;
      // Held at what it shrinks toward: with that fitted, no override of its own (calibration_for layers the base or
      // same chip's value in); else the start profile's values stay as they were.
      if (p.scope == Scope::Hardware) {
        auto it = res.calibration.per_hardware.find(p.name);
        if (it != res.calibration.per_hardware.end() && p.base >= 0) it->second.erase(p.info->key);
      } else {
        put(res.calibration, p, prior_v, "prior kept: " + from + " do not identify it; prior: " + prior_prov);
      }
    } else {
      const std::string prov = p.scope == Scope::Hardware
                                   ? "fitted: " + from + " (hardware " + p.name + ", shrunk toward " + p.toward + ")"
                                   : "fitted: " + from + "; prior " + buf + " (" + prior_prov + ")";
      put(res.calibration, p, fc.value, prov);
    }
    res.coefficients.push_back(fc);
  }
  for (auto it = res.calibration.per_hardware.begin(); it != res.calibration.per_hardware.end();)
    it = it->second.empty() ? res.calibration.per_hardware.erase(it) : std::next(it);

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
      if (!fitted_case(cases[i])) continue;
      std::vector<MeasuredCase> rest;
      for (size_t j = 0; j < cases.size(); ++j)
        if (j != i) rest.push_back(cases[j]);
      FitOptions o = opt;
      o.leave_one_out = false;
      Calibration cal_i;
      try {
        cal_i = fit_calibration(rest, start, priors, o).calibration;
      } catch (const UserError&) {
        continue;  // too few values left
      }
      for (size_t k = 0; k < data.size(); ++k)
        if (data[k].case_index == i) res.points[k].loo_predicted = predict(cases[i], data[k].q, cal_i);
    }
  }
  for (const FitPoint& fp : res.points) loo.push_back(fp.loo_error());
  res.mape_before = mean_abs(before);
  res.mape = mean_abs(after);
  res.loo_mape = mean_abs(loo);
  return res;
}

std::string fit_report(const FitResult& r) {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "%-28s %-14s %12s %12s %9s %12s %9s\n", "id", "quantity", "measured", "predicted",
                "residual", "loo_pred", "loo_err");
  out += line;
  for (const FitPoint& p : r.points) {
    const double scale = p.quantity == Quantity::PeakBytes ? 1e-9 : 1.0;  // GB for memory, as given otherwise
    if (std::isfinite(p.loo_predicted))
      std::snprintf(line, sizeof line, "%-28s %-14s %12.4g %12.4g %8.1f%% %12.4g %8.1f%%\n", p.id.c_str(),
                    to_string(p.quantity), p.measured * scale, p.predicted * scale, 100 * p.residual(),
                    p.loo_predicted * scale, 100 * p.loo_error());
    else
      std::snprintf(line, sizeof line, "%-28s %-14s %12.4g %12.4g %8.1f%% %12s %9s\n", p.id.c_str(),
                    to_string(p.quantity), p.measured * scale, p.predicted * scale, 100 * p.residual(), "-", "-");
    out += line;
  }
  if (std::isfinite(r.loo_mape))
    std::snprintf(line, sizeof line, "mean |error|: start %.1f%%, fitted %.1f%%, leave-one-out %.1f%% (%zu coefficients, %d iterations)\n",
                  100 * r.mape_before, 100 * r.mape, 100 * r.loo_mape, r.coefficients.size(), r.iterations);
  else
    std::snprintf(line, sizeof line, "mean |error|: start %.1f%%, fitted %.1f%% (%zu coefficients, %d iterations)\n",
                  100 * r.mape_before, 100 * r.mape, r.coefficients.size(), r.iterations);
  out += line;
  std::snprintf(line, sizeof line, "\n%-36s %-26s %12s %12s  %s\n", "coefficient", "scope", "prior", "value", "identified");
  out += line;
  for (const FittedCoefficient& c : r.coefficients) {
    std::snprintf(line, sizeof line, "%-36s %-26s %12.4g %12.4g  %s\n", c.key.c_str(), c.scope.c_str(), c.prior, c.value,
                  c.identified ? "yes" : "no: prior kept");
    out += line;
  }
  return out;
}

}  // namespace lcplan
