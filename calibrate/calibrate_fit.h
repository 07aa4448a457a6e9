// Least-squares calibration: fit the free coefficients of a Calibration to measured runs (CPU only, Eigen).
// Residual of each measured value = predicted / measured - 1; Levenberg-Marquardt with numerical derivatives,
// linearised around the current values, each coefficient bounded to its physical range (coefficient_table()).
#pragma once

#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "calibrate/measurement.h"

namespace lcplan {

struct FitOptions {
  std::vector<std::string> keys;  // coefficients to fit; empty = every `fittable` one in coefficient_table()
  std::string source;             // provenance label of the data, e.g. "data/validation/megatron-runs.json"
  bool leave_one_out = true;
  int max_iterations = 200;
  double huber_delta = 0;         // > 0: pseudo-Huber loss on relative residuals (robust to outlier runs)
};

enum class Quantity { PeakBytes, StepSeconds, TflopsPerGpu };
const char* to_string(Quantity q);

struct FitPoint {
  std::string id;
  Quantity quantity{};
  double measured = 0;
  double predicted_before = 0;  // with the starting calibration
  double predicted = 0;         // with the fitted calibration
  double loo_predicted = 0;     // fitted without this measurement (NaN when too few points remain)
  double residual() const { return predicted / measured - 1; }
  double loo_error() const { return loo_predicted / measured - 1; }
};

struct FitResult {
  Calibration calibration;        // the start with fitted values and "fitted: ..." provenance
  std::vector<std::string> keys;  // coefficients fitted
  std::vector<FitPoint> points;
  double mape_before = 0, mape = 0, loo_mape = 0;  // mean |relative error|; loo_mape NaN when unavailable
  int iterations = 0;
};

// Predicted value of one measured quantity under a calibration.
double predict(const MeasuredCase& c, Quantity q, const Calibration& cal);

// Throws UserError (one sentence with the counts) when there are more free coefficients than measured values,
// or when a key is unknown / not fittable.
FitResult fit_calibration(const std::vector<MeasuredCase>& cases, const Calibration& start, const FitOptions& opt);

// Per-run table: id, quantity, measured, predicted, residual, leave-one-out prediction and error.
std::string fit_report(const FitResult& r);

}  // namespace lcplan
