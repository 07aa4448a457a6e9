// Validation of a calibration profile against measured runs, the way users meet it: predicted vs measured per run
// with the profile as it is (in sample), and out of sample by refitting the profile without one model (leave one
// model out), one hardware (leave one hardware out) or one context band (leave one band out: <= 8K, 16-32K, >= 64K
// tokens per sequence) from the priors, then predicting the group left out.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/calibrate_fit.h"

namespace lcplan {

// The context band of a sequence length: "<=8K", "16-32K" or ">=64K" (lengths between bands join the next one up).
std::string context_band(double seq_len);

struct ValidationRow {
  std::string id, model, hardware, precision, implementation, context;
  Quantity quantity{};
  double measured = 0;
  double predicted = 0;       // the profile as given
  double lomo_predicted = 0;  // refitted without this row's model (NaN: not refitted)
  double lomo_error() const { return lomo_predicted / measured - 1; }
  double loho_predicted = 0;  // refitted without this row's hardware (NaN: not refitted)
  double loho_error() const { return loho_predicted / measured - 1; }
  double lobo_predicted = 0;  // refitted without this row's context band (NaN: not refitted)
  double lobo_error() const { return lobo_predicted / measured - 1; }
  double error() const { return predicted / measured - 1; }
  bool fitted = true;         // false: an older report, or a peak checked not fitted (left out of the summaries)
  std::string note;           // superseded_by, or why the peak is not fitted
};

struct GroupError {
  std::string group;  // "model qwen3-30b-a3b", "hardware b200", ...
  int rows = 0;
  double in_sample = 0, out_of_sample = 0;  // mean |relative error|; out of sample: leave that group out
};

// A run that ran out of memory (status out_of_memory) against the estimate: did lcplan predict it would not fit?
struct FitCheck {
  std::string id, model, hardware;
  double predicted_peak = 0, capacity = 0;  // bytes: the estimate's peak and the hardware's memory
  bool predicted_fits() const { return predicted_peak <= capacity; }
};

struct ValidationReport {
  std::vector<ValidationRow> rows;
  std::vector<FitCheck> out_of_memory;  // runs that ran out of memory, each against the predicted peak
  std::vector<std::pair<std::string, std::string>> not_modelled;  // id, reason
  // Mean |relative error| over fitted rows of TFLOP/s (or step time where no TFLOP/s is given) and of peak memory.
  double time_in_sample = 0, time_lomo = 0, time_loho = 0, time_lobo = 0;
  double memory_in_sample = 0;
  int time_rows = 0, memory_rows = 0;
  std::vector<GroupError> by_model, by_hardware, by_context;
  ErrorBand time_band, memory_band;  // 10th/90th percentile of the out-of-sample (time) and in-sample (memory) residuals
  bool refitted = false;
};

struct ValidateOptions {
  bool refit = true;  // leave-one-model/hardware/context-band-out refits (needs the profile's "fit" spec)
  std::string source;
};

// `profile` as loaded (unresolved); `priors` the prior profile its fit spec refers to.
// `out_of_memory`: runs with status out_of_memory, checked against the predicted peak instead of fitted.
ValidationReport validate_profile(const std::vector<MeasuredCase>& cases, const std::vector<Measurement>& not_modelled,
                                  const Calibration& profile, const Calibration& priors, const ValidateOptions& opt,
                                  const std::vector<MeasuredCase>& out_of_memory = {});

std::string validation_table(const ValidationReport& r);
nlohmann::json validation_json(const ValidationReport& r);

}  // namespace lcplan
