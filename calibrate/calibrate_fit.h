// Calibration from measured runs: a regularized least-squares fit of a profile's coefficients (CPU only, Eigen).
//
// Parameters are coefficients in one of three scopes: the base value every plan reads, a hardware profile's
// override, or an implementation's override (estimator/calibration.h). Each is fitted in log space. The objective is
//   sum over measured values of rho(predicted / measured - 1) / model_error^2            (pseudo-Huber rho)
// + sum over base and implementation parameters of ((ln value - ln prior) / prior log_sigma)^2
// + sum over hardware overrides of ((ln value - ln base value) / hardware_log_sigma)^2,
// so published figures (the prior profile, data/calibration/priors.json) hold every coefficient the data cannot
// move, and a hardware's value strays from the shared one only as far as its own rows demand. A coefficient whose
// posterior spread is not narrower than its prior's (the data do not identify it) is put back to its prior and the
// provenance says so. Levenberg-Marquardt with a numerical Jacobian; bounds by projection (coefficient_table()).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/measurement.h"
#include "estimator/calibration.h"

namespace lcplan {

// Which coefficients a fit frees, and how: stored in the fitted profile's "fit" field so that `lcplan validate` can
// refit the profile without a model or a hardware.
struct FitSpec {
  std::vector<std::string> keys;                // base coefficients
  std::vector<std::string> per_hardware;        // coefficients fitted per hardware profile present in the data
  std::vector<std::string> per_implementation;  // coefficients fitted per implementation present in the data
  double huber_delta = 0.05;                    // relative error beyond which a residual counts linearly (0: squares)
  double model_error = 0.1;                     // expected relative error of a prediction (weights data vs priors)
  double hardware_log_sigma = 0.25;             // prior width of a hardware override around the base value
  double identified_ratio = 0.9;                // posterior / prior spread above which a coefficient is unidentified
                                                // (unless the data reject its prior: calibrate_fit.cpp solve)
};
nlohmann::json fit_spec_to_json(const FitSpec& s);
FitSpec fit_spec_from_json(const nlohmann::json& j);  // throws UserError naming the field

struct FitOptions {
  FitSpec spec;
  std::string source;             // provenance label of the data, e.g. "data/validation/megatron-bridge-h100-runs.json"
  bool leave_one_out = true;
  int max_iterations = 100;
  // Refuse more free coefficients than measured values. Validation's leave-a-group-out refits turn it off: there the
  // priors hold what the rows left do not identify (a band of 11 long-context rows cannot refit every coefficient).
  bool require_determined = true;
};

enum class Quantity { PeakBytes, StepSeconds, TflopsPerGpu };
const char* to_string(Quantity q);

struct FitPoint {
  std::string id;
  Quantity quantity{};
  double measured = 0;
  double predicted_before = 0;  // with the starting calibration
  double predicted = 0;         // with the fitted calibration
  double loo_predicted = 0;     // fitted without this measurement (NaN when skipped)
  double residual() const { return predicted / measured - 1; }
  double loo_error() const { return loo_predicted / measured - 1; }
};

struct FittedCoefficient {
  std::string key, scope;  // scope: "base", "hardware <name>" or "implementation <name>"
  double prior = 0, value = 0;
  bool identified = true;
};

struct FitResult {
  Calibration calibration;  // the start with fitted values, "fit" spec and provenance
  std::vector<FittedCoefficient> coefficients;
  std::vector<FitPoint> points;
  double mape_before = 0, mape = 0, loo_mape = 0;  // mean |relative error|; loo_mape NaN when unavailable
  int iterations = 0;
};

// Predicted value of one measured quantity under a profile (resolved for the case's hardware and implementation).
double predict(const MeasuredCase& c, Quantity q, const Calibration& profile);
// The measured values of the cases that are fitted (superseded reports are predicted, never fitted).
bool fitted_case(const MeasuredCase& c);

// Throws UserError (one sentence) when a key is unknown or not fittable, or when there are more free coefficients
// than measured values. `priors` supplies the prior values and widths (its log_sigma entries).
FitResult fit_calibration(const std::vector<MeasuredCase>& cases, const Calibration& start, const Calibration& priors,
                          const FitOptions& opt);

// Per-run table: id, quantity, measured, predicted, residual, leave-one-out prediction and error; then the
// coefficients with prior, fitted value and whether the data identified them.
std::string fit_report(const FitResult& r);

}  // namespace lcplan
