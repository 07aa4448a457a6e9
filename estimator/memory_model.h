// Per-GPU memory, term by term, per pipeline stage; the peak is the maximum over stages and schedule phases.
// A pure function of (ModelSpec, Plan, Hardware, Calibration); see README "What each number means".
#pragma once

#include <array>
#include <vector>

#include "estimator/calibration.h"
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

// The plan must be valid (check_plan); callers that accept user input call require_valid_plan first.
MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Calibration& cal);

// Pieces exposed for unit tests and for the time model.
struct StageParams {
  double dense = 0;    // non-expert parameters on this GPU before optimizer/FSDP sharding (after TP)
  double expert = 0;   // routed-expert parameters on this GPU before sharding (after EP*ETP)
  double max_unit = 0; // largest FSDP unit (layer, embedding, LM head) on this GPU, unsharded
};
StageParams stage_params(const ModelSpec& m, const Plan& p, int stage);

// Saved activation bytes of one layer for one microbatch on this GPU under the plan's recompute mode
// (full recompute -> the layer input only) and with nothing recomputed (the working set when it is rematerialized).
struct LayerActivation {
  double saved = 0;
  double full = 0;
  double moe_tokens = 0;  // part of `full` that scales with routed tokens (chunked under chunked EP)
};
LayerActivation layer_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer, bool recomputed);

}  // namespace lcplan
