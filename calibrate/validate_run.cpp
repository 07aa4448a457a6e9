#include "calibrate/validate_run.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/user_error.h"
#include "estimator/estimate.h"

namespace lcplan {

namespace {

// Each category's estimate beside its measurement, in the table's order.
std::vector<CategoryRow> rows(const MemoryBreakdown& est, const MemoryBreakdown& meas) {
  std::vector<CategoryRow> r;
  for (const MemoryCategoryInfo& c : kMemoryCategories) r.push_back({c.name, est.*c.member, meas.*c.member});
  return r;
}

std::string mib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3f", b / 1048576.0);
  return s;
}
std::string pct(double r) {
  if (std::isinf(r)) return "new";
  char s[32];
  std::snprintf(s, sizeof s, "%+.1f%%", 100 * r);
  return s;
}

}  // namespace

double CategoryRow::rel() const {
  if (estimate == 0) return measured == 0 ? 0 : std::numeric_limits<double>::infinity();
  return measured / estimate - 1;
}

std::optional<double> TimeRow::rel() const {
  if (!measured || estimate <= 0) return std::nullopt;
  return *measured / estimate - 1;
}

double worst_relative_error(const std::vector<CategoryRow>& rs, double floor_bytes) {
  double worst = 0;
  for (const CategoryRow& r : rs) {
    if (std::max(r.estimate, r.measured) < floor_bytes) continue;
    worst = std::max(worst, std::abs(r.rel()));
  }
  return worst;
}

Comparison compare(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal,
                   const Measurement& meas) {
  Comparison c;
  // Memory is compared at the routing the run had: the busiest rank's routed token copies over the mean, which the
  // estimator's routing_imbalance stands for (lcplan-exec records it; small runs route unevenly).
  Plan plan = p;
  if (meas.executor.is_object() && meas.executor.contains("moe_routing_load") &&
      meas.executor.at("moe_routing_load").is_number()) {
    const double load = meas.executor.at("moe_routing_load").get<double>();
    if (std::isfinite(load) && load > p.moe.routing_imbalance && load <= 64 && p.moe.capacity_factor == 0) {
      plan.moe.routing_imbalance = load;
      char s[160];
      std::snprintf(s, sizeof s, "memory estimated at the run's routing load %.3f (busiest rank's routed tokens over the "
                    "mean; the plan says %.3f)", load, p.moe.routing_imbalance);
      c.notes.push_back(s);
    }
  }
  const DerivedPlan d = derive_plan(m, plan, hw);
  const MemoryEstimate mem = estimate_memory(d, cal);
  const Estimate est = estimate(d, hw, cal, mem);
  c.estimate_peak_phase = mem.peak_phase;
  c.estimate_peak = mem.peak_bytes;
  c.measured_peak = meas.peak_bytes;
  c.measured_peak_phase = meas.peak_phase;
  const StageMemory& stage = mem.stages[size_t(mem.peak_stage)];
  std::array<MemoryBreakdown, 4> phases;
  for (int ph = 0; ph < 4; ++ph) phases[ph] = stage.phase(Phase(ph));
  // The peak phase's categories, like for like: the estimate of the phase the run peaked in (else the estimate's peak
  // phase) against that phase's per-category maxima (the estimator's terms are maxima), else the breakdown at the peak.
  const Phase at = meas.peak_phase ? *meas.peak_phase : mem.peak_phase;
  const std::optional<MeasuredPhase>& mp = meas.phases[int(at)];
  if (mp && mp->category_peaks) c.at_peak = rows(phases[int(at)], *mp->category_peaks);
  else if (meas.breakdown) c.at_peak = rows(phases[int(at)], *meas.breakdown);
  for (int ph = 0; ph < 4; ++ph) {
    if (Phase(ph) == Phase::Loss && mem.peak_stage != p.parallel.pp - 1) continue;
    PhaseRow row;
    row.phase = Phase(ph);
    row.estimate = phases[ph].total();
    if (meas.phases[ph]) {
      row.measured = meas.phases[ph]->peak_bytes;
      // Each category's own peak within the phase when recorded (the estimator's phase terms are maxima), else the
      // breakdown at the phase's peak.
      if (meas.phases[ph]->category_peaks) row.categories = rows(phases[ph], *meas.phases[ph]->category_peaks);
      else if (meas.phases[ph]->breakdown) row.categories = rows(phases[ph], *meas.phases[ph]->breakdown);
    }
    c.phases.push_back(row);
  }
  const PhaseSeconds& est_ph = est.time.phases;
  for (const auto& [ph, secs] :
       {std::pair{Phase::Forward, est_ph.forward}, std::pair{Phase::Loss, est_ph.loss},
        std::pair{Phase::Backward, est_ph.backward}, std::pair{Phase::Optimizer, est_ph.optimizer}}) {
    TimeRow row;
    row.phase = ph;
    row.estimate = secs;
    if (meas.phases[int(ph)]) row.measured = meas.phases[int(ph)]->seconds;
    c.time.push_back(row);
  }
  c.estimate_step_seconds = est.time.step_seconds;
  c.measured_step_seconds = meas.step_seconds;
  c.estimate_time = estimate_to_json(est, plan)["time"];
  if (plan.parallel.pp > 1) {
    c.estimate_bubble_seconds = est.time.breakdown.bubble;
    if (meas.executor.is_object() && meas.executor.contains("pipeline_wait_seconds")) {
      const nlohmann::json& w = meas.executor.at("pipeline_wait_seconds");
      if (!w.is_number() || w.get<double>() < 0)
        throw UserError("the record's executor.pipeline_wait_seconds is " + w.dump() +
                        "; it must be a number of seconds, at least 0");
      c.measured_pipeline_wait_seconds = w.get<double>();
    }
  }
  if (c.measured_peak_phase && *c.measured_peak_phase != c.estimate_peak_phase)
    c.notes.push_back(std::string("the measured peak is in the ") + to_string(*c.measured_peak_phase) +
                      " phase, the estimate's in the " + to_string(c.estimate_peak_phase) + " phase");
  // lcplan-exec records its backend ("cpu"); `lcplan profile --backend cpu` names the hardware it measures cpu-<host>.
  if (!meas.device.empty() && meas.device != hw.name && hw.name.rfind(meas.device + "-", 0) != 0)
    c.notes.push_back("time: the estimate is for " + hw.name + ", the measurement ran on " + meas.device +
                      "; compare times only on a hardware and calibration profile measured on that device (a CPU "
                      "run: --hardware cpu-amd-epyc-2c --calibration cpu-measured, or your own `lcplan profile`)");
  return c;
}

std::string comparison_table(const Comparison& c) {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %14s %14s %9s\n", "memory (MiB)", "estimate", "measured", "diff");
  s += line;
  std::snprintf(line, sizeof line, "%-14s %14s %14s %9s\n", "peak", mib(c.estimate_peak).c_str(),
                c.measured_peak ? mib(*c.measured_peak).c_str() : "-",
                c.measured_peak && c.estimate_peak > 0 ? pct(*c.measured_peak / c.estimate_peak - 1).c_str() : "");
  s += line;
  std::snprintf(line, sizeof line, "%-14s %14s %14s\n", "peak phase", to_string(c.estimate_peak_phase),
                c.measured_peak_phase ? to_string(*c.measured_peak_phase) : "-");
  s += line;
  s += "categories in the measured peak phase (estimate of that phase; measured: each category's maximum in it)\n";
  for (const CategoryRow& r : c.at_peak) {
    if (r.estimate == 0 && r.measured == 0) continue;
    std::snprintf(line, sizeof line, "  %-12s %14s %14s %9s\n", r.category.c_str(), mib(r.estimate).c_str(),
                  mib(r.measured).c_str(), pct(r.rel()).c_str());
    s += line;
  }
  s += "\nper phase (peak total, MiB)     estimate       measured      diff\n";
  for (const PhaseRow& r : c.phases) {
    std::snprintf(line, sizeof line, "  %-28s %10s %14s %9s\n", to_string(r.phase), mib(r.estimate).c_str(),
                  r.measured ? mib(*r.measured).c_str() : "-",
                  r.measured && r.estimate > 0 ? pct(*r.measured / r.estimate - 1).c_str() : "");
    s += line;
  }
  // Time: the estimate on the plan's hardware profile; measured, the median step after the first and each phase's
  // median (so the phases need not add up to the step exactly).
  std::snprintf(line, sizeof line, "\n%-14s %14s %14s %9s\n", "time (s/step)", "estimate", "measured", "diff");
  s += line;
  auto time_line = [&](const char* name, double est, std::optional<double> meas) {
    char e[32], m[32] = "-";
    auto secs = [](char* out, size_t n, double v) { std::snprintf(out, n, v == 0 || v >= 1e-3 ? "%.4f" : "%.2e", v); };
    secs(e, sizeof e, est);
    if (meas) secs(m, sizeof m, *meas);
    std::snprintf(line, sizeof line, "  %-12s %14s %14s %9s\n", name, e, m,
                  meas && est > 0 ? pct(*meas / est - 1).c_str() : "");
    s += line;
  };
  for (const TimeRow& r : c.time) time_line(to_string(r.phase), r.estimate, r.measured);
  time_line("step", c.estimate_step_seconds, c.measured_step_seconds);
  if (c.estimate_bubble_seconds) time_line("pp bubble", *c.estimate_bubble_seconds, c.measured_pipeline_wait_seconds);
  for (const std::string& n : c.notes) s += "note: " + n + "\n";
  return s;
}

nlohmann::json comparison_to_json(const Comparison& c) {
  auto cats = [](const std::vector<CategoryRow>& rs) {
    nlohmann::json j = nlohmann::json::object();
    for (const CategoryRow& r : rs) {
      nlohmann::json x = {{"estimate", r.estimate}, {"measured", r.measured}};
      if (!std::isinf(r.rel())) x["relative_error"] = r.rel();
      j[r.category] = x;
    }
    return j;
  };
  nlohmann::json j;
  j["peak"] = {{"estimate", c.estimate_peak}, {"estimate_phase", to_string(c.estimate_peak_phase)}};
  if (c.measured_peak) j["peak"]["measured"] = *c.measured_peak;
  if (c.measured_peak_phase) j["peak"]["measured_phase"] = to_string(*c.measured_peak_phase);
  j["breakdown_at_peak"] = cats(c.at_peak);
  nlohmann::json ph = nlohmann::json::object();
  for (const PhaseRow& r : c.phases) {
    nlohmann::json x = {{"estimate", r.estimate}};
    if (r.measured) x["measured"] = *r.measured;
    if (!r.categories.empty()) x["breakdown"] = cats(r.categories);
    ph[to_string(r.phase)] = x;
  }
  j["phases"] = ph;
  j["time"] = {{"estimate_step_seconds", c.estimate_step_seconds}, {"estimate", c.estimate_time}};
  nlohmann::json tph = nlohmann::json::object();
  for (const TimeRow& r : c.time) {
    nlohmann::json x = {{"estimate", r.estimate}};
    if (r.measured) x["measured"] = *r.measured;
    if (r.rel()) x["relative_error"] = *r.rel();
    tph[to_string(r.phase)] = x;
  }
  j["time"]["phases"] = tph;
  if (c.measured_step_seconds) j["time"]["measured_step_seconds"] = *c.measured_step_seconds;
  if (c.estimate_bubble_seconds) {
    j["time"]["pipeline_bubble"] = {{"estimate", *c.estimate_bubble_seconds}};
    if (c.measured_pipeline_wait_seconds) j["time"]["pipeline_bubble"]["measured"] = *c.measured_pipeline_wait_seconds;
  }
  j["notes"] = c.notes;
  return j;
}

}  // namespace lcplan
