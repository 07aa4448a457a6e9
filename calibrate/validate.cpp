#include "calibrate/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "common/user_error.h"
#include "estimator/frameworks.h"

namespace lcplan {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The quantity a row is judged on: TFLOP/s per GPU when measured, else step time; memory separately.
std::vector<Quantity> quantities_of(const Measurement& m) {
  std::vector<Quantity> q;
  if (m.tflops_per_gpu) q.push_back(Quantity::TflopsPerGpu);
  else if (m.step_seconds) q.push_back(Quantity::StepSeconds);
  if (m.peak_bytes) q.push_back(Quantity::PeakBytes);
  return q;
}

double measured_of(const Measurement& m, Quantity q) {
  switch (q) {
    case Quantity::PeakBytes: return *m.peak_bytes;
    case Quantity::StepSeconds: return *m.step_seconds;
    case Quantity::TflopsPerGpu: return *m.tflops_per_gpu;
  }
  return kNaN;
}

// The start of an out-of-sample refit: the profile with every fitted coefficient back at its prior and no fitted
// overrides, so nothing learnt from the rows left out leaks into their prediction.
Calibration refit_start(const Calibration& profile, const Calibration& priors, const FitSpec& spec) {
  Calibration s = profile;
  for (const std::string& key : spec.keys) {
    const CoefficientInfo* info = find_coefficient(key);
    s.*(info->member) = priors.*(info->member);
  }
  for (const std::string& key : spec.per_hardware)
    for (auto& [name, over] : s.per_hardware) over.erase(key);
  for (const std::string& key : spec.per_implementation)
    for (auto& [name, over] : s.per_implementation) {
      over.erase(key);
      if (auto it = priors.per_implementation.find(name); it != priors.per_implementation.end())
        if (auto o = it->second.find(key); o != it->second.end()) over[key] = o->second;
    }
  return s;
}

double mean_abs(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += std::abs(x), ++n;
  return n ? s / n : kNaN;
}

double quantile(std::vector<double> v, double q) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const size_t i = size_t(pos);
  return i + 1 < v.size() ? v[i] + (pos - i) * (v[i + 1] - v[i]) : v[i];
}

// Refits without the cases whose `group_of` is `left_out` and predicts those cases.
void predict_left_out(const std::vector<MeasuredCase>& cases, const Calibration& start, const Calibration& priors,
                      const FitSpec& spec, const std::string& left_out,
                      std::string (*group_of)(const MeasuredCase&), std::vector<ValidationRow>& rows,
                      double ValidationRow::*field, const std::vector<std::pair<size_t, Quantity>>& index) {
  std::vector<MeasuredCase> rest;
  for (const MeasuredCase& c : cases)
    if (group_of(c) != left_out) rest.push_back(c);
  FitOptions o;
  o.spec = spec;
  o.leave_one_out = false;
  o.require_determined = false;  // the priors hold what the rows left out do not identify
  Calibration fitted;
  try {
    fitted = fit_calibration(rest, start, priors, o).calibration;
  } catch (const UserError&) {
    return;  // too few rows left to refit: no out-of-sample prediction
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const MeasuredCase& c = cases[index[r].first];
    if (group_of(c) == left_out) rows[r].*field = predict(c, index[r].second, fitted);
  }
}

// The frameworks (calibration keys: megatron-bridge is megatron) whose fitted time rows ran more than one model, sorted.
std::vector<std::string> frameworks_of_several_models(const std::vector<ValidationRow>& rows) {
  std::map<std::string, std::set<std::string>> models;
  for (const ValidationRow& r : rows)
    if (r.fitted && r.quantity != Quantity::PeakBytes) models[calibration_key(r.implementation)].insert(r.model);
  std::vector<std::string> out;
  for (const auto& [framework, names] : models)
    if (names.size() > 1) out.push_back(framework);
  return out;
}

// A model named by its config file reads as the file's stem (models/x.json -> x), as a zoo model reads by its name.
std::string model_of(const MeasuredCase& c) {
  const std::string& m = c.meas.plan.model;
  return m.size() > 5 && m.compare(m.size() - 5, 5, ".json") == 0 ? std::filesystem::path(m).stem().string() : m;
}
std::string hardware_of(const MeasuredCase& c) { return c.hw.name; }
std::string context_of(const MeasuredCase& c) { return context_band(double(c.meas.plan.seq_len)); }

// The groups a validation leaves out in turn, the way users meet lcplan: a new model, a new machine, a new context.
struct LeaveOut {
  std::string (*group_of)(const MeasuredCase&);
  double ValidationRow::*predicted;
};
constexpr LeaveOut kLeaveOuts[] = {{model_of, &ValidationRow::lomo_predicted},
                                   {hardware_of, &ValidationRow::loho_predicted},
                                   {context_of, &ValidationRow::lobo_predicted}};

std::vector<GroupError> group_errors(const std::vector<ValidationRow>& rows, std::string ValidationRow::*key,
                                     double (ValidationRow::*oos)() const, const char* label) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by;
  for (const ValidationRow& r : rows)
    if (r.fitted && r.quantity != Quantity::PeakBytes) {
      by[r.*key].first.push_back(r.error());
      by[r.*key].second.push_back((r.*oos)());
    }
  std::vector<GroupError> out;
  for (const auto& [g, errs] : by)
    out.push_back({std::string(label) + " " + g, int(errs.first.size()), mean_abs(errs.first), mean_abs(errs.second)});
  return out;
}

}  // namespace

std::string context_band(double seq_len) {
  if (seq_len <= 8192) return "<=8K";
  if (seq_len <= 32768) return "16-32K";
  return ">=64K";
}

ValidationReport validate_profile(const std::vector<MeasuredCase>& cases, const std::vector<Measurement>& not_modelled,
                                  const Calibration& profile, const Calibration& priors, const ValidateOptions& opt,
                                  const std::vector<MeasuredCase>& out_of_memory) {
  ValidationReport rep;
  for (const MeasuredCase& c : out_of_memory)
    rep.out_of_memory.push_back({c.meas.id, c.meas.plan.model, c.hw.name, predict(c, Quantity::PeakBytes, profile), c.hw.hbm_bytes});
  for (const Measurement& m : not_modelled) rep.not_modelled.emplace_back(m.id, m.not_modelled);
  std::vector<std::pair<size_t, Quantity>> index;
  for (size_t i = 0; i < cases.size(); ++i) {
    const MeasuredCase& c = cases[i];
    for (Quantity q : quantities_of(c.meas)) {
      ValidationRow r;
      r.id = c.meas.id;
      r.model = model_of(c);
      r.hardware = c.hw.name;
      r.context = context_of(c);
      r.precision = to_string(c.meas.plan.precision);
      r.implementation = c.meas.plan.implementation;
      r.quantity = q;
      r.measured = measured_of(c.meas, q);
      r.predicted = predict(c, q, profile);
      r.lomo_predicted = r.loho_predicted = r.lobo_predicted = kNaN;
      const bool memory_checked = q == Quantity::PeakBytes && !c.meas.memory_not_fitted.empty();
      r.fitted = fitted_case(c) && !memory_checked;
      r.note = !c.meas.superseded_by.empty() ? "superseded by " + c.meas.superseded_by
               : memory_checked              ? "checked, not fitted: " + c.meas.memory_not_fitted
                                             : "";
      rep.rows.push_back(r);
      index.emplace_back(i, q);
    }
  }
  if (opt.refit) {
    if (profile.fit.is_null())
      throw UserError("calibration \"" + profile.name +
                      "\" records no fit, so it cannot be refitted without a group (use --no-refit, or a profile made by lcplan calibrate)");
    const FitSpec spec = fit_spec_from_json(profile.fit);
    const Calibration start = refit_start(profile, priors, spec);
    for (const LeaveOut& lo : kLeaveOuts) {
      std::set<std::string> groups;
      for (const MeasuredCase& c : cases) groups.insert(lo.group_of(c));
      for (const std::string& g : groups)
        predict_left_out(cases, start, priors, spec, g, lo.group_of, rep.rows, lo.predicted, index);
    }
    rep.refitted = true;
  }
  std::vector<double> t_in, t_lomo, t_loho, t_lobo, m_in;
  std::vector<Quantity> t_quantity;
  std::vector<bool> t_known_framework;
  const std::vector<std::string> known = frameworks_of_several_models(rep.rows);
  for (const ValidationRow& r : rep.rows) {
    if (!r.fitted) continue;
    if (r.quantity == Quantity::PeakBytes) {
      m_in.push_back(r.error());
    } else {
      t_in.push_back(r.error());
      t_quantity.push_back(r.quantity);
      t_lomo.push_back(r.lomo_error());
      t_loho.push_back(r.loho_error());
      t_lobo.push_back(r.lobo_error());
      t_known_framework.push_back(std::binary_search(known.begin(), known.end(), calibration_key(r.implementation)));
    }
  }
  rep.time_rows = int(t_in.size());
  rep.memory_rows = int(m_in.size());
  rep.time_in_sample = mean_abs(t_in);
  rep.time_lomo = mean_abs(t_lomo);
  rep.time_loho = mean_abs(t_loho);
  rep.time_lobo = mean_abs(t_lobo);
  rep.memory_in_sample = mean_abs(m_in);
  rep.by_model = group_errors(rep.rows, &ValidationRow::model, &ValidationRow::lomo_error, "model");
  rep.by_hardware = group_errors(rep.rows, &ValidationRow::hardware, &ValidationRow::loho_error, "hardware");
  rep.by_context = group_errors(rep.rows, &ValidationRow::context, &ValidationRow::lobo_error, "context");
  // The band an estimate carries: out-of-sample residuals when refitted (what a new model meets), else in sample, of
  // step time: a TFLOP/s residual r is a step-time residual 1 / (1 + r) - 1 (the same FLOPs). A new model on a
  // framework the fit knows: a model alone on its framework, left out, takes the framework's coefficients with it,
  // which measures a new framework instead (an estimate says when its framework is not in the fit).
  const bool any_known = !known.empty();
  std::vector<double> time_res;
  for (size_t k = 0; k < t_in.size(); ++k) {
    if (rep.refitted && any_known && !t_known_framework[k]) continue;
    const double r = rep.refitted ? t_lomo[k] : t_in[k];
    time_res.push_back(t_quantity[k] == Quantity::TflopsPerGpu ? 1 / (1 + r) - 1 : r);
  }
  const std::string which = any_known && time_res.size() < t_in.size()
                                ? "leave-one-model-out residuals of the rows whose framework other models also ran, of "
                                : "leave-one-model-out residuals of ";
  rep.time_band = {quantile(time_res, 0.1), quantile(time_res, 0.9), int(time_res.size()),
                   rep.refitted ? which + opt.source : "in-sample residuals of " + opt.source, {}};
  if (rep.refitted && any_known) rep.time_band.frameworks = known;
  rep.memory_band = {quantile(m_in, 0.1), quantile(m_in, 0.9), int(m_in.size()), "in-sample residuals of " + opt.source, {}};
  return rep;
}

std::string validation_table(const ValidationReport& r) {
  std::string out;
  char line[400];
  auto pct = [](double x) {
    char b[16];
    if (std::isfinite(x)) std::snprintf(b, sizeof b, "%+.1f%%", 100 * x);
    else std::snprintf(b, sizeof b, "-");
    return std::string(b);
  };
  auto unsigned_pct = [&](double x) { return std::isfinite(x) ? pct(x).substr(1) : std::string("-"); };
  std::snprintf(line, sizeof line, "%-22s %-18s %-12s %-6s %-9s %10s %10s %8s %8s %8s %8s  %s\n", "id", "model",
                "hardware", "prec", "quantity", "measured", "predicted", "error", "lomo", "loho", "lobo", "note");
  out += line;
  for (const ValidationRow& v : r.rows) {
    const double scale = v.quantity == Quantity::PeakBytes ? 1e-9 : 1.0;
    const char* q = v.quantity == Quantity::PeakBytes ? "peak GB" : v.quantity == Quantity::StepSeconds ? "step s" : "TFLOP/s";
    std::snprintf(line, sizeof line, "%-22.22s %-18.18s %-12.12s %-6s %-9s %10.4g %10.4g %8s %8s %8s %8s  %s\n",
                  v.id.c_str(), v.model.c_str(), v.hardware.c_str(), v.precision.c_str(), q, v.measured * scale,
                  v.predicted * scale, pct(v.error()).c_str(), pct(v.lomo_error()).c_str(), pct(v.loho_error()).c_str(),
                  pct(v.lobo_error()).c_str(), v.note.c_str());
    out += line;
  }
  for (const auto& [id, why] : r.not_modelled) {
    std::snprintf(line, sizeof line, "%-22.22s not modelled: %s\n", id.c_str(), why.c_str());
    out += line;
  }
  for (const FitCheck& f : r.out_of_memory) {
    std::snprintf(line, sizeof line, "%-22.22s ran out of memory; predicted peak %.1f GiB %s the %.1f GiB of %s: %s\n",
                  f.id.c_str(), f.predicted_peak / (1 << 30), f.predicted_fits() ? "within" : "above",
                  f.capacity / (1 << 30), f.hardware.c_str(),
                  f.predicted_fits() ? "the estimate said it fits" : "as predicted");
    out += line;
  }
  out += "\nmean |error| over the newest report of each configuration:\n";
  std::snprintf(line, sizeof line,
                "  time (%d rows): in sample %.1f%%, leave one model out %s, leave one hardware out %s, leave one "
                "context band out %s\n",
                r.time_rows, 100 * r.time_in_sample, r.refitted ? unsigned_pct(r.time_lomo).c_str() : "not run",
                r.refitted ? unsigned_pct(r.time_loho).c_str() : "not run",
                r.refitted ? unsigned_pct(r.time_lobo).c_str() : "not run");
  out += line;
  if (r.memory_rows > 0) {
    std::snprintf(line, sizeof line, "  peak memory (%d rows): in sample %.1f%%\n", r.memory_rows, 100 * r.memory_in_sample);
    out += line;
  }
  for (const auto* groups : {&r.by_model, &r.by_hardware, &r.by_context})
    for (const GroupError& g : *groups) {
      std::snprintf(line, sizeof line, "  %-32s %3d rows: in sample %5.1f%%, left out %s\n", g.group.c_str(), g.rows,
                    100 * g.in_sample, r.refitted ? unsigned_pct(g.out_of_sample).c_str() : "-");
      out += line;
    }
  std::snprintf(line, sizeof line, "  error band (10th-90th percentile): time %+.1f%% .. %+.1f%%, memory %+.1f%% .. %+.1f%%\n",
                100 * r.time_band.low, 100 * r.time_band.high, 100 * r.memory_band.low, 100 * r.memory_band.high);
  out += line;
  if (!r.time_band.frameworks.empty()) {
    std::string names;
    for (const std::string& f : r.time_band.frameworks) names += (names.empty() ? "" : ", ") + f;
    out += "  the time band: new models on " + names + " (" + std::to_string(r.time_band.points) +
           " rows; a model alone on its framework, left out, measures a new framework)\n";
  }
  return out;
}

nlohmann::json validation_json(const ValidationReport& r) {
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json rows = nlohmann::json::array();
  for (const ValidationRow& v : r.rows)
    rows.push_back({{"id", v.id},
                    {"model", v.model},
                    {"hardware", v.hardware},
                    {"precision", v.precision},
                    {"implementation", v.implementation},
                    {"quantity", to_string(v.quantity)},
                    {"measured", v.measured},
                    {"predicted", v.predicted},
                    {"error", num(v.error())},
                    {"lomo_predicted", num(v.lomo_predicted)},
                    {"loho_predicted", num(v.loho_predicted)},
                    {"lobo_predicted", num(v.lobo_predicted)},
                    {"context", v.context},
                    {"fitted", v.fitted},
                    {"note", v.note}});
  nlohmann::json oom = nlohmann::json::array();
  for (const FitCheck& f : r.out_of_memory)
    oom.push_back({{"id", f.id}, {"model", f.model}, {"hardware", f.hardware}, {"predicted_peak_bytes", f.predicted_peak},
                   {"capacity_bytes", f.capacity}, {"predicted_fits", f.predicted_fits()}});
  nlohmann::json nm = nlohmann::json::array();
  for (const auto& [id, why] : r.not_modelled) nm.push_back({{"id", id}, {"reason", why}});
  auto groups = [&](const std::vector<GroupError>& gs) {
    nlohmann::json a = nlohmann::json::array();
    for (const GroupError& g : gs)
      a.push_back({{"group", g.group}, {"rows", g.rows}, {"in_sample", num(g.in_sample)}, {"left_out", num(g.out_of_sample)}});
    return a;
  };
  return {{"rows", rows},
          {"out_of_memory", oom},
          {"not_modelled", nm},
          {"summary",
           {{"time_rows", r.time_rows},
            {"time_in_sample", num(r.time_in_sample)},
            {"time_leave_one_model_out", num(r.time_lomo)},
            {"time_leave_one_hardware_out", num(r.time_loho)},
            {"time_leave_one_context_band_out", num(r.time_lobo)},
            {"memory_rows", r.memory_rows},
            {"memory_in_sample", num(r.memory_in_sample)},
            {"by_model", groups(r.by_model)},
            {"by_hardware", groups(r.by_hardware)},
            {"by_context", groups(r.by_context)},
            {"time_band",
             {{"low", r.time_band.low}, {"high", r.time_band.high}, {"points", r.time_band.points},
              {"frameworks", r.time_band.frameworks}}},
            {"memory_band", {{"low", r.memory_band.low}, {"high", r.memory_band.high}, {"points", r.memory_band.points}}}}}};
}

}  // namespace lcplan
