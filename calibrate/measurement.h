// Measurement: what a real run (or the executor) observed for one plan; the input of `lcplan calibrate`.
//
// JSON record (README "Measurement"): {"id": "...", "source": <string or object>, "plan": {recipe.json},
//   "scope": "step" | "moe_layer", "peak_bytes": x, "step_seconds": x, "tflops_per_gpu": x, "notes": "..."}
// At least one of peak_bytes / step_seconds / tflops_per_gpu is required. scope "moe_layer" measures one MoE layer
// forward+backward on one rank (the article's chunked-EP proxy) and takes step_seconds only.
// Optional: "status": "ok" (default) | "out_of_memory" -- the run hit CUDA out-of-memory, so the plan did not fit on
// its hardware (a tune loop treats it as infeasible; `lcplan calibrate` skips it; it may carry no measured value);
// "failure": the reason line; "peak_reserved_bytes": what the caching allocator reserved at most (Megatron's
// `max reserved`), kept for reference and not fitted.
// A file holds a JSON array of records, or {"measurements": [...]}. Unknown fields are errors naming the field.
//
// Optional detail (lcplan-exec writes it; `lcplan validate` compares it with the estimate), all byte values >= 0:
//   "breakdown": {"<category>": bytes} at the peak, a key per estimator/memory_categories.h row (missing keys read 0),
//   "peak_phase": "forward" | "loss" | "backward" | "optimizer",  "peak_rank": n,
//   "phases": {"<phase>": {"peak_bytes", "breakdown", "category_peaks", "seconds"}},
//   "ranks": [{"rank", "peak_bytes", "peak_phase", "workspace_high_water_bytes"}],
//   "scale": {"factor", "layers_per_kind", "mtp_dropped", "kept_layers": [..], "model": {..}},
//   "steps", "loss", "grad_norm", "per_step": [{"loss", "grad_norm", "seconds"}],
//   "backend", "device", "host" (strings), "executor" (an object of implementation facts, not interpreted).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <array>
#include <map>

#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

enum class MeasurementScope { Step, MoeLayer };
enum class MeasurementStatus { Ok, OutOfMemory };

struct MeasuredPhase {
  std::optional<double> peak_bytes;
  std::optional<MemoryBreakdown> breakdown;       // at the phase's peak
  std::optional<MemoryBreakdown> category_peaks;  // each category's own largest value during the phase
  std::optional<double> seconds;
};

struct MeasuredRank {
  int rank = 0;
  std::optional<double> peak_bytes;
  std::optional<Phase> peak_phase;
  std::optional<double> workspace_high_water_bytes;
};

// How a measured model was derived from the plan's model (lcplan-exec --scale / --layers; executor/scale.h).
struct MeasuredScale {
  int factor = 1;
  int layers_per_kind = 0;
  int mtp_dropped = 0;
  std::vector<int> kept_layers;
  nlohmann::json model;  // the scaled model's sizes, for people (not interpreted)
};

struct MeasuredStep {
  std::optional<double> loss, grad_norm, seconds;
};

struct Measurement {
  std::string id;
  std::string source;
  Plan plan;
  MeasurementScope scope = MeasurementScope::Step;
  std::optional<double> peak_bytes;
  std::optional<int> peak_stage;  // the pipeline stage whose peak was measured (default: the largest over stages)
  std::optional<double> step_seconds;
  std::optional<double> tflops_per_gpu;
  MeasurementStatus status = MeasurementStatus::Ok;
  std::string failure;                        // why the run failed (status out_of_memory)
  std::optional<double> peak_reserved_bytes;  // allocator's reserved peak (reference only)
  std::string notes;
  std::string not_modelled;   // non-empty: the run is of something lcplan does not model (the reason); not predicted
  std::string superseded_by;  // non-empty: an older report of the same configuration; predicted, never fitted
  std::string memory_not_fitted;  // non-empty: why its peak_bytes is predicted and checked but not fitted

  // Optional detail (see the record above).
  std::optional<MemoryBreakdown> breakdown;
  std::optional<Phase> peak_phase;
  std::optional<int> peak_rank;
  std::array<std::optional<MeasuredPhase>, 4> phases;  // indexed by Phase
  std::vector<MeasuredRank> ranks;
  std::optional<MeasuredScale> scale;
  std::optional<int> steps;
  std::optional<double> loss, grad_norm;
  std::vector<MeasuredStep> per_step;
  std::string backend, device, host;
  nlohmann::json executor;  // null when absent
};

// The breakdown record ({"params": ..}, estimator/estimate.h breakdown_to_json writes it) -> MemoryBreakdown; `where`
// names the record in errors (UserError).
MemoryBreakdown breakdown_from_json(const nlohmann::json& j, const std::string& where);
// "forward" -> Phase::Forward; throws UserError naming the value otherwise.
Phase phase_from_string(const std::string& s, const std::string& where);
// The record as JSON (the fields the parser accepts; what lcplan-exec writes).
nlohmann::json measurement_to_json(const Measurement& m);

// Throws UserError naming the record and the field.
Measurement measurement_from_json(const nlohmann::json& j, const std::string& where);
std::vector<Measurement> measurements_from_json(const nlohmann::json& j, const std::string& where);
std::vector<Measurement> load_measurements(const std::string& path);

// A measurement with the model and hardware its plan names, resolved once.
struct MeasuredCase {
  Measurement meas;
  ModelSpec model;
  Hardware hw;
};
// Loads each plan's model (zoo name or path) and hardware from data_dir and checks each plan is valid. Measurements
// marked not_modelled are left out (they have no model to load). A plan that breaks a rule throws UserError, unless
// `impossible` is given: then the measurement goes there with not_modelled = "impossible configuration: <rule>".
// One sentence when `m` is an lcplan-exec record of a model scaled down from its plan's (its `scale`), which only
// `lcplan validate --measured` compares (it scales the plan the same way); "" otherwise. resolve_measurements and the
// report refuse such records.
std::string scaled_record_error(const Measurement& m);

std::vector<MeasuredCase> resolve_measurements(const std::vector<Measurement>& ms, const std::string& data_dir,
                                               std::vector<Measurement>* impossible = nullptr);

}  // namespace lcplan
