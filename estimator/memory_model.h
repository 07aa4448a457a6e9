// Per-GPU memory, term by term, per pipeline stage; the peak is the maximum over stages and schedule phases.
// A pure function of (ModelSpec, Plan, Hardware, Calibration); see README "What each number means".
#pragma once

#include <array>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

enum class Phase : int { Forward, Loss, Backward, Optimizer };
const char* to_string(Phase p);

struct MemoryBreakdown {
  double params = 0;         // bf16 weights resident on this GPU (sharded under FSDP)
  double grads = 0;          // main gradients (fp32 by default)
  double optimizer = 0;      // fp32 master weights + Adam moments, after sharding (0 when offloaded)
  double fsdp_buffers = 0;   // all-gathered current + prefetched unit and the unsharded gradient of one unit
  double activations = 0;    // saved activations of in-flight microbatches + the recomputed layer's working set
  double logits = 0;         // materialized logits, or linear CE's tiles and per-token statistics
  double moe_buffers = 0;    // transient dispatch/combine/permutation buffers of the MoE layer being run
  double workspace = 0;      // cuBLAS/attention workspaces, NCCL buffers
  double cuda_context = 0;   // CUDA context outside the caching allocator
  double fragmentation = 0;  // allocator overhead on the dynamic terms

  double total() const {
    return params + grads + optimizer + fsdp_buffers + activations + logits + moe_buffers + workspace + cuda_context +
           fragmentation;
  }
};

struct StageMemory {
  int stage = 0;
  int layers = 0;            // decoder layers held by this stage (all virtual chunks)
  double inflight_microbatches = 0;  // microbatches whose activations the stage holds at its peak (summed over chunks, weighted)
  Phase peak_phase = Phase::Backward;
  MemoryBreakdown breakdown;  // at this stage's peak phase
  double peak_bytes = 0;
};

struct MemoryEstimate {
  double peak_bytes = 0;
  int peak_stage = 0;
  Phase peak_phase = Phase::Backward;
  std::vector<StageMemory> stages;
};

// Reads the plan's derived record (estimator/derived_plan.h); the plan must be valid (check_plan).
MemoryEstimate estimate_memory(const DerivedPlan& d, const Calibration& cal);
// Convenience for callers holding no derived record: derives it, then estimates.
MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal);

}  // namespace lcplan
