// `lcplan report`: one self-contained HTML page (inline CSS, inline SVG drawn by report/svg.h, no network, no
// scripts) drawing an estimate record, and for a search the search record: plan and model tables, per-stage memory
// as stacked bars by category with the capacity line, step time as a stacked bar, the error bands when the records
// carry them, the Pareto front, the reduced recipe, and measured runs beside the predictions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

// One measured step (calibrate/measurement.h) to draw beside the prediction for the same plan.
struct MeasuredRun {
  std::string id;
  Plan plan;
  std::optional<double> peak_bytes, step_seconds, tflops_per_gpu;
  nlohmann::json breakdown;  // optional: bytes per memory category (and per-phase peaks) as the record gives them
};

// A measurement file (a JSON array, {"measurements": [...]}, or one record) as measured runs: each record is checked
// by calibrate's parser, with an optional "breakdown" object of byte counts (numbers, or objects of numbers such as
// per-phase peaks). Runs of scope "moe_layer" are left out; a file with no whole-step run is a UserError.
std::vector<MeasuredRun> measured_runs_from_json(const nlohmann::json& j, const std::string& where);

struct ReportInput {
  ModelSpec model;
  Hardware hardware;
  nlohmann::json estimate;  // the plan drawn: `lcplan estimate --json`'s record, or the search's best (top[0])
  nlohmann::json search;    // `lcplan search --json`'s record for a search report, else null
  // `lcplan search --seq-lengths --json`'s record for a search over a length distribution, else null; `estimate`
  // is then its best plan's record over the drawn batches.
  nlohmann::json batch_search;
  std::vector<MeasuredRun> measured;
  std::string command;      // the command line that made the page, shown at the top
};

// Whether two plans are the same recipe (gpus_per_node 0 = the hardware's, global batch 0 = its default).
bool same_plan(const Plan& a, const Plan& b, const Hardware& hw);

// How many measured runs are for a plan the page draws (the estimate, a top or Pareto plan, the reduced recipe).
size_t matched_measured_runs(const ReportInput& in);

// The whole page. Numbers are the records' own: GiB (2^30 bytes) with two decimals, TFLOP/s with one, seconds with
// three. Every string from the records, the model and the command line is escaped.
std::string report_html(const ReportInput& in);

}  // namespace lcplan
