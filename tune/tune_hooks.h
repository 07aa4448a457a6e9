// The hooks `lcplan tune` runs (tune/tune_loop.h's rank, run, predict, refit), written once: the CLI, the tests and
// the benchmark all call make_tune_hooks, so a test of the loop exercises what users run. Only `say` (the progress
// lines) and `runnable` (which plans the launcher can run) differ between callers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "models/model_spec.h"
#include "search/plan_space.h"
#include "search/search.h"
#include "tune/refit.h"
#include "tune/tune_loop.h"

namespace lcplan {

struct TuneSetup {
  ModelSpec model;      // the model every plan trains (already loaded: a zoo name, a config.json or Megatron flags)
  Hardware hardware;    // the machine every plan runs on
  Plan base;            // the fixed fields; the search walks `space` around it
  PlanSpace space;
  SearchOptions search;  // headroom, objective; top_k and admit are the hooks'
  std::function<bool(const Plan&)> runnable;  // plans the launcher can run (empty: every plan)
  std::string launch_template;  // the command each run expands (tune/launcher.h placeholders)
  std::string run_dir;          // run-NNN/{plan.json, log.txt, measured.json}
  double run_timeout = 3600;    // seconds
  int skip_iterations = 1;      // Megatron-LM log lines dropped as warm-up
  TuneRefitOptions refit;       // the candidate keys, prior width, provenance
  Calibration start;            // the refit's prior: the tune's starting calibration, flattened
  std::string data_dir;         // where measured runs' models and hardware resolve
  std::function<void(const std::string&)> say;  // a progress line (empty: quiet)
};

// The real hooks over `setup`, which must outlive them. on_run / on_round are left to the caller (the log writer).
TuneHooks make_tune_hooks(const TuneSetup& setup);

// The flags of a plan as Megatron-LM reads them, one line: search/emit.h's flags without its comment lines.
std::string megatron_flags_line(const Plan& p, const ModelSpec& m);

// "predicted 0.214 s, measured 0.197 s: the prediction 8.6% high" (the run's line, and tune's final table).
std::string prediction_against_measurement(double predicted, double measured);

}  // namespace lcplan
