// Per-GPU memory, term by term, per pipeline stage; the peak is the maximum over stages and schedule phases.
// A pure function of (ModelSpec, Plan, Hardware, Calibration); see README "What each number means".
#pragma once

#include <array>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/memory_categories.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

enum class Phase : int { Forward, Loss, Backward, Optimizer };
const char* to_string(Phase p);

// The terms of one stage that come and go with the schedule's phases; with the static terms (weights, gradients,
// optimizer state, workspace, context) they give each phase's breakdown (StageMemory::phase).
struct PhaseTerms {
  double saved_activations = 0;  // in-flight microbatches' saved activations (every phase but the optimizer's)
  double rebuilt = 0;            // the rebuilt layer's extra working set (backward)
  double moe_buffers = 0;        // the running MoE layer's buffers (forward and backward)
  double logits = 0;             // the loss side (the loss phase)
  double fsdp_gather = 0;        // all-gathered current + prefetched unit (forward, loss and backward)
  double fsdp_grad = 0;          // one unit's unsharded gradient (backward)
  double fragmentation = 0;      // allocator overhead per byte of the dynamic terms (memory.fragmentation)
};

struct StageMemory {
  int stage = 0;
  int layers = 0;            // decoder layers held by this stage (all virtual chunks)
  double inflight_microbatches = 0;  // microbatches whose activations the stage holds at its peak (summed over chunks, weighted)
  Phase peak_phase = Phase::Backward;
  bool has_loss = false;      // the last stage, the only one that runs the loss phase
  MemoryBreakdown breakdown;  // at this stage's peak phase
  double peak_bytes = 0;
  PhaseTerms terms;
  // The breakdown in phase `p`, composed as the peak's was (so phase(peak_phase) == breakdown): all zero for the loss
  // phase of a stage that has none. Kept as terms, not four breakdowns: the search builds millions of estimates.
  MemoryBreakdown phase(Phase p) const;
};

struct MemoryEstimate {
  double peak_bytes = 0;
  int peak_stage = 0;
  Phase peak_phase = Phase::Backward;
  std::vector<StageMemory> stages;
};

// Reads the plan's derived record (estimator/derived_plan.h); the plan must be valid (check_plan).
MemoryEstimate estimate_memory(const DerivedPlan& d, const Calibration& cal);
// One stage of it. Its peak never falls when the stage saves more activations, all else equal (what
// DerivedPlan::peak_stages relies on).
StageMemory stage_memory(const DerivedPlan& d, const Calibration& cal, int stage);
// One MoE layer's forward + backward by itself on this rank, as Megatron-LM's moe_perf benchmark measures it (bytes
// allocated at the peak: no optimizer state, context or allocator overhead). 0 when the model has no MoE layer.
double moe_layer_peak_bytes(const DerivedPlan& d, const Calibration& cal);
// Convenience for callers holding no derived record: derives it, then estimates.
MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal);

}  // namespace lcplan
