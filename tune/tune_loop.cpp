#include "tune/tune_loop.h"

#include <algorithm>
#include <cmath>

#include "common/user_error.h"

namespace lcplan {

std::string plan_key(const Plan& p) { return plan_to_json(p).dump(); }

const char* to_string(TuneStop s) {
  switch (s) {
    case TuneStop::Stable: return "stable";
    case TuneStop::NoNewPlans: return "no new plans";
    case TuneStop::Budget: return "budget spent";
    case TuneStop::Rounds: return "last round";
  }
  return "?";
}

int measured_fastest(const std::vector<TuneRun>& runs) {
  int best = 0;
  for (const TuneRun& r : runs) {
    const Measurement& m = r.measured;
    if (m.status != MeasurementStatus::Ok || !m.step_seconds) continue;
    if (best == 0 || *m.step_seconds < *runs[size_t(best - 1)].measured.step_seconds) best = r.index;
  }
  return best;
}

namespace {

bool ok(const TuneRun& r) { return r.measured.status == MeasurementStatus::Ok && r.measured.step_seconds.has_value(); }

// Mean |predicted / measured - 1| over the runs that measured a step time, under `cal`.
double mean_error(const TuneState& s, const TuneHooks& h, const Calibration& cal) {
  double sum = 0;
  int n = 0;
  for (const TuneRun& r : s.runs)
    if (ok(r)) {
      sum += std::abs(h.predict(r.measured, cal) / *r.measured.step_seconds - 1);
      ++n;
    }
  return n ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

TuneOutcome run_tune(TuneState& state, const TuneHooks& hooks, const TuneOptions& opt) {
  if (opt.plans_per_round < 1 || opt.max_runs < 1 || opt.max_rounds < 1)
    throw UserError("tune needs at least one plan per round, one run and one round");
  auto measured_keys = [&] {
    std::set<std::string> keys;
    for (const TuneRun& r : state.runs) keys.insert(r.ranked.key);
    return keys;
  };
  auto did_not_fit = [&] {
    std::set<std::string> keys;
    for (const TuneRun& r : state.runs)
      if (r.measured.status == MeasurementStatus::OutOfMemory) keys.insert(r.ranked.key);
    return keys;
  };
  // Enough of the ranking to find `plans_per_round` plans not run yet behind the ones that were.
  auto rank = [&] {
    return hooks.rank(state.calibration, opt.plans_per_round + int(state.runs.size()), did_not_fit());
  };
  // A tune resumed after a stable round has nothing left to do.
  if (!state.rounds.empty() && state.rounds.back().stable) return {TuneStop::Stable, measured_fastest(state.runs)};
  for (;;) {
    const int round = int(state.rounds.size()) + 1;
    bool resumed_round = false;  // runs of this round exist: an interrupted tune is finishing it
    for (const TuneRun& r : state.runs) resumed_round = resumed_round || r.round == round;
    if (round > opt.max_rounds) return {TuneStop::Rounds, measured_fastest(state.runs)};

    // The best plans not run yet: this round's share, less what an interrupted tune already ran of it, within budget.
    int this_round = 0;
    for (const TuneRun& r : state.runs) this_round += r.round == round;
    const int budget = opt.max_runs - int(state.runs.size());
    const int want = std::min(opt.plans_per_round - this_round, budget);
    const std::set<std::string> done = measured_keys();
    std::vector<RankedPlan> to_run;
    for (const RankedPlan& p : rank())
      if (!done.count(p.key) && int(to_run.size()) < want) to_run.push_back(p);
    if (to_run.empty() && !resumed_round)
      return {budget <= 0 ? TuneStop::Budget : TuneStop::NoNewPlans, measured_fastest(state.runs)};

    TuneRound rec;
    rec.round = round;
    for (const TuneRun& r : state.runs)
      if (r.round == round) rec.ran.push_back(r.index);
    for (const RankedPlan& p : to_run) {
      const int index = int(state.runs.size()) + 1;
      TuneRun r = hooks.run(p, index);
      r.index = index;
      r.round = round;
      r.ranked = p;
      state.runs.push_back(std::move(r));
      rec.ran.push_back(index);
      if (hooks.on_run) hooks.on_run(state);
    }

    // Refit to every run that measured a step time; runs that did not fit only leave the ranking.
    std::vector<Measurement> measured;
    for (const TuneRun& r : state.runs)
      if (ok(r)) measured.push_back(r.measured);
    rec.error_before = mean_error(state, hooks, state.calibration);
    if (!measured.empty()) {
      FitResult fit = hooks.refit(measured, state.calibration);
      rec.coefficients = fit.coefficients;
      state.calibration = std::move(fit.calibration);
    }
    rec.error_after = mean_error(state, hooks, state.calibration);

    const std::vector<RankedPlan> ranking = rank();
    const std::set<std::string> now = measured_keys();
    rec.ranking.assign(ranking.begin(), ranking.begin() + std::min<size_t>(ranking.size(), size_t(opt.plans_per_round)));
    rec.chosen_run = measured_fastest(state.runs);
    bool all_measured = !rec.ranking.empty();
    for (const RankedPlan& p : rec.ranking) all_measured = all_measured && now.count(p.key);
    bool chosen_ties_best = false;
    if (rec.chosen_run > 0 && !rec.ranking.empty()) {
      const TuneRun& c = state.runs[size_t(rec.chosen_run - 1)];
      const double best = rec.ranking.front().predicted_seconds;
      chosen_ties_best = hooks.predict(c.measured, state.calibration) <= best * (1 + opt.tie);
    }
    rec.stable = all_measured && chosen_ties_best && rec.error_after <= opt.settled;
    bool any_left = false;
    for (const RankedPlan& p : ranking) any_left = any_left || !now.count(p.key);
    state.rounds.push_back(rec);
    if (hooks.on_round) hooks.on_round(state);
    if (rec.stable) return {TuneStop::Stable, rec.chosen_run};
    if (!any_left) return {TuneStop::NoNewPlans, rec.chosen_run};
    if (int(state.runs.size()) >= opt.max_runs) return {TuneStop::Budget, rec.chosen_run};
  }
}

}  // namespace lcplan
