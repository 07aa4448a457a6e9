// lcplan tune: the loop that checks the ranking against real runs and learns from them (README "Tune").
//
// Each round ranks the plans under the current calibration, runs the best `plans_per_round` plans not run yet,
// refits the calibration to every measured run, and ranks again. It is stable when every plan of the refit ranking's
// top `plans_per_round` has been measured, the measured-fastest run is one the model cannot tell from its best
// (predicted within `tie` of it) and the refit predicts the runs within `settled`: another round would only repeat
// what was measured. It also stops when no plan
// is left to run, when the budget of runs is spent, or after the last round. The chosen plan is the measured-fastest
// run. Searching, running and fitting are functions the caller gives, so the loop is tested without a cluster
// (tests/tune) and the CLI wires the real ones (cli/cmd_tune.cpp).
#pragma once

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "calibrate/calibrate_fit.h"
#include "calibrate/measurement.h"
#include "estimator/calibration.h"
#include "estimator/plan.h"

namespace lcplan {

// The canonical recipe JSON of a plan on one line: two plans are the same run when their keys are equal.
std::string plan_key(const Plan& p);

struct RankedPlan {
  Plan plan;
  std::string key;                 // plan_key(plan)
  double predicted_seconds = 0;    // step time under the calibration that ranked it
  double predicted_peak_bytes = 0;
};

struct TuneRun {
  int index = 0;             // 1-based, in the order the runs were made
  int round = 0;             // the round that chose it
  RankedPlan ranked;         // the plan as ranked when it was chosen
  Measurement measured;      // status ok (with step_seconds) or out_of_memory
  std::string command, log;  // how it ran and where its output is (for people reading the log)
};

struct TuneRound {
  int round = 0;
  std::vector<int> ran;                          // indices of the runs made in this round
  std::vector<FittedCoefficient> coefficients;   // the refit (empty when nothing was fitted)
  double error_before = std::numeric_limits<double>::quiet_NaN();  // mean |predicted/measured - 1| over every
  double error_after = std::numeric_limits<double>::quiet_NaN();   // measured run, before and after the refit
  std::vector<RankedPlan> ranking;               // the best plans under the refit calibration
  int chosen_run = 0;                            // the measured-fastest run so far (0: none fit)
  bool stable = false;
};

struct TuneState {
  Calibration calibration;  // the current calibration: the start, then each round's refit
  std::vector<TuneRun> runs;
  std::vector<TuneRound> rounds;
};

struct TuneOptions {
  int plans_per_round = 3;  // k: the best plans run each round (those not run yet)
  int max_runs = 9;         // runs over the whole tune, resumed ones included
  int max_rounds = 4;
  double tie = 0.03;        // predicted step times closer than this (relative) are a tie the model cannot order
  double settled = 0.10;    // stable also needs the refit to predict the runs within this mean error
};

struct TuneHooks {
  // The best `count` plans under `cal`, best first (fewer when fewer fit), leaving out the plans named in `skip` (runs
  // that did not fit).
  // Throws UserError when nothing fits.
  std::function<std::vector<RankedPlan>(const Calibration& cal, int count, const std::set<std::string>& skip)> rank;
  // Runs one plan and returns the run with `measured`, `command` and `log` set. Throws UserError when the run
  // failed for a reason other than running out of memory (the tune stops; the run is not recorded).
  std::function<TuneRun(const RankedPlan& plan, int index)> run;
  // The calibration refitted to the measured runs (status ok), starting from `current`.
  std::function<FitResult(const std::vector<Measurement>& measured, const Calibration& current)> refit;
  // Predicted step seconds of a measured run's plan under a calibration (the round's errors).
  std::function<double(const Measurement& run, const Calibration& cal)> predict;
  // Called after every run and every round: the CLI writes the log there (so a tune resumes) and prints.
  std::function<void(const TuneState&)> on_run, on_round;
};

enum class TuneStop { Stable, NoNewPlans, Budget, Rounds };
const char* to_string(TuneStop s);

struct TuneOutcome {
  TuneStop stop = TuneStop::Rounds;
  int chosen_run = 0;  // the measured-fastest run that fit (0: none did)
};

// Runs rounds until a stop condition; `state` may hold runs and rounds of an interrupted tune (resume): runs already
// made are never repeated, and a round whose runs were interrupted is finished.
TuneOutcome run_tune(TuneState& state, const TuneHooks& hooks, const TuneOptions& opt);

// The measured-fastest run with status ok and a step time (0 when none).
int measured_fastest(const std::vector<TuneRun>& runs);

}  // namespace lcplan
