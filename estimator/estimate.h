// One plan, end to end: memory + time + fits, as printed by `lcplan estimate` and returned by the search.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/plan.h"
#include "estimator/time_model.h"
#include "models/model_spec.h"

namespace lcplan {

struct Estimate {
  MemoryEstimate memory;
  TimeEstimate time;
  double capacity_bytes = 0;  // hardware HBM
  // Error bands from the calibration profile's validation residuals (10th-90th percentile): where the measured
  // value is expected. Equal to the estimate when the profile carries no validation.
  struct Band {
    double low = 0, high = 0;
  };
  Band peak_bytes_band, tflops_band, step_seconds_band;
  int band_points = 0;        // validation points behind the time band (0: no band)
  bool fits = false;          // the upper end of the peak-memory band <= capacity_bytes
  bool fits_at_estimate = false;  // the peak itself <= capacity_bytes
  std::vector<std::string> warnings;
};

// The plan must be valid (require_valid_plan); this is the only entry point the CLI and the search use.
Estimate estimate(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal);
// The same from the plan's derived record, reusing a memory estimate already computed from it (the search
// derives the plan once and computes memory first).
Estimate estimate(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, MemoryEstimate memory);
// The same with its time estimate too (the search estimates time from stage costs it keeps).
Estimate estimate(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, MemoryEstimate memory,
                  TimeEstimate time);

// The design's record format (README "Estimate record").
nlohmann::json estimate_to_json(const Estimate& e, const Plan& p);
// A breakdown as records hold it: {"<category name>": bytes} for every kMemoryCategories row.
nlohmann::json breakdown_to_json(const MemoryBreakdown& b);

// "FITS", "MAY NOT FIT (...)" when the peak fits but its band's upper end does not, or "DOES NOT FIT".
const char* fit_verdict(bool fits, bool fits_at_estimate);

// The upper end of a peak's band under a calibration (the peak when the profile has no memory band).
double peak_upper_bound(double peak_bytes, const Calibration& cal);

// The first line of every output about a run: model, GPUs and hardware, sequence, global batch (saying when it is the
// default, one sequence per GPU) and implementation; with `per_plan`, the micro batch and microbatches per DP rank
// too (a search's plans differ in them).
std::string run_header(const Plan& p, const std::string& model, const std::string& hardware, bool global_batch_defaulted,
                       bool per_plan);

// Human-readable report: per-stage memory breakdown (GiB and GB), peak, fits, time breakdown.
std::string estimate_table(const Estimate& e, const Plan& p, const ModelSpec& m, const Hardware& hw);

}  // namespace lcplan
