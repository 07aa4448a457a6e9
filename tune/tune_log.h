// The tune log (README "Tune"): what a tune was asked, every run it made with its measurement, every round with
// its refit and ranking, and the current calibration. Written after every run and round; a tune started again with
// the same request resumes from it. The caller adds "refit" ({fit, prior_width}): a tune resumed with other refit
// settings keeps its runs and refits them again.
//
// {"lcplan_tune_log": 1, "request": {...}, "calibration": {calibration profile}, "stop": "..."?, "chosen_run": n?,
//  "runs": [{"index", "round", "plan", "predicted_step_seconds", "predicted_peak_bytes", "command", "log",
//            "measurement": {measurement record}}],
//  "rounds": [{"round", "ran": [..], "error_before", "error_after", "coefficients": [{"key", "scope", "prior",
//              "value", "identified"}], "ranking": [{"plan", "predicted_step_seconds", "predicted_peak_bytes"}],
//              "chosen_run", "stable"}]}
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tune/tune_loop.h"

namespace lcplan {

nlohmann::json tune_log_json(const nlohmann::json& request, const TuneState& state,
                             const std::optional<TuneOutcome>& outcome = std::nullopt);

// The state a log holds. Throws UserError (one sentence naming the file) when the log is malformed or was written for
// another request: the first field that differs is named, so the user can give another --log or the same flags.
TuneState tune_state_from_log(const nlohmann::json& log, const nlohmann::json& request, const std::string& file);

}  // namespace lcplan
