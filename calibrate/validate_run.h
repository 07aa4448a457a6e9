// Validation of one measured run against its plan: memory per category at the peak and per schedule phase (the
// estimator's own per-phase breakdowns, StageMemory::phase), and time per phase.
// `lcplan validate --plan recipe.json --measured measured.json` prints this (cli/cmd_validate_run.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/measurement.h"
#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct CategoryRow {
  std::string category;  // the category's name (estimator/memory_categories.h)
  double estimate = 0, measured = 0;
  // measured / estimate - 1, or 0 when both are 0 (and +inf when only the measurement is non-zero)
  double rel() const;
};

struct PhaseRow {
  Phase phase = Phase::Forward;
  double estimate = 0;                 // estimated total of the phase
  std::optional<double> measured;      // measured peak total of the phase
  std::vector<CategoryRow> categories;  // when the measurement has this phase's breakdown
};

// Seconds per step of one phase: the estimator's (TimeEstimate::phases, on the plan's hardware profile) and the
// run's (the record's phases[].seconds: median over the steps after the first of the slowest rank's time).
struct TimeRow {
  Phase phase = Phase::Forward;
  double estimate = 0;
  std::optional<double> measured;
  // measured / estimate - 1 when both are known and the estimate is positive
  std::optional<double> rel() const;
};

struct Comparison {
  Phase estimate_peak_phase = Phase::Backward;
  std::optional<Phase> measured_peak_phase;
  double estimate_peak = 0;
  std::optional<double> measured_peak;
  // The measured peak phase, per category: the estimate of that phase against each category's own maximum in it
  // (category_peaks; the estimator's phase terms are such maxima), or the breakdown at the peak when not recorded.
  std::vector<CategoryRow> at_peak;
  std::vector<PhaseRow> phases;
  std::vector<TimeRow> time;         // forward, loss, backward, optimizer
  double estimate_step_seconds = 0;  // on the plan's hardware profile (the sum of `time`'s estimates)
  std::optional<double> measured_step_seconds;  // the record's step_seconds (median step; not the sum of the phases)
  // Pipeline plans: the estimator's bubble (TimeBreakdown::bubble) against the run's (the record's
  // executor.pipeline_wait_seconds: the least time any rank waited on others in a step, median step; it also holds
  // the transfers).
  std::optional<double> estimate_bubble_seconds, measured_pipeline_wait_seconds;
  nlohmann::json estimate_time;      // the estimator's time breakdown (seconds)
  std::vector<std::string> notes;
};

// The measurement must be for (m, p): the model the run used (scaled as recorded) and the plan it ran. When the
// record carries the run's routing load (executor.moe_routing_load) above the plan's routing_imbalance, memory is
// estimated at that load (and a note says so).
Comparison compare(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal,
                   const Measurement& meas);

// Largest |rel()| over the categories of `rows` whose estimate or measurement is at least `floor_bytes` (tiny terms
// are compared in absolute bytes instead: a 2 KiB term 50% off is not a finding).
double worst_relative_error(const std::vector<CategoryRow>& rows, double floor_bytes);

std::string comparison_table(const Comparison& c);
nlohmann::json comparison_to_json(const Comparison& c);

}  // namespace lcplan
