// The refit a tune makes after each round: lcplan calibrate's regularized fit (calibrate/calibrate_fit.h) of step
// times only, priors at the tune's starting calibration, and at most one free coefficient per two runs -- chosen by
// greedy forward selection (the key whose addition fits the runs best, then the next), so a handful of runs moves the
// coefficients they actually inform and a fit never passes through every run by construction.
#pragma once

#include <string>
#include <vector>

#include "calibrate/calibrate_fit.h"

namespace lcplan {

struct TuneRefitOptions {
  std::vector<std::string> keys;  // candidates, in no particular order
  double prior_width = 1.0;       // log_sigma of every candidate's prior around the starting value
  double model_error = 0.05;      // repeated runs on one machine: tighter than the cross-cluster corpus
  std::string source;             // provenance label (the tune log)
};

// `cases` with step times; `start` is the tune's starting (flattened) calibration, the prior; `current` where the fit
// starts. Throws UserError (from the fit) for an unknown key.
FitResult refit_for_tune(std::vector<MeasuredCase> cases, const Calibration& current, const Calibration& start,
                         const TuneRefitOptions& opt);

}  // namespace lcplan
