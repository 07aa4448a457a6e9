// Frameworks as capability tables: what `megatron` (Megatron-LM), `megatron-bridge` (its perf recipes), `bumblebee`
// (the article's framework) and `lcplan-exec` (this repository's executor) can run, what a plan that leaves a run
// setting unset gets from each, and which calibration overrides each reads. The search walks only what the plan's
// framework runs (search/plan_space.h), `estimate` refuses what it cannot run with one sentence naming the field and
// the frameworks that run it, and the time model leaves a switch off where the framework never overlaps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct Capabilities {
  bool chunked_ep = false;        // moe.ep_chunks > 1 (one layer's all-to-all chunked under its own GEMMs)
  bool ep_overlap = false;        // moe.a2a_overlap (one microbatch's all-to-all under another's compute)
  bool dp_overlap = false;        // comm.overlap_grad_reduce / overlap_param_gather take effect
  bool tp_overlap = false;        // comm.tp_overlap takes effect
  bool unfused_permute = false;   // moe.permute_fusion false takes effect (else the framework's own permutation)
  bool linear_ce = false;
  bool low_precision = false;     // fp8, mxfp8, nvfp4
  bool fp8_extras = false;        // fp8.param_gather, fp8.attention
  bool optimizer_offload = false;
  bool partial_optimizer_offload = false;
  bool offload_needs_precision_aware = false;  // Megatron-LM: --optimizer-cpu-offload with the precision-aware optimizer
  bool activation_offload = false;  // offload.activations (every layer)
  bool module_offload = false;      // offload.modules
  bool optimizer_dtypes = false;    // the precision-aware optimizer and its state dtypes
  bool bf16_grads = false;
  bool token_dropping = false;      // moe.capacity_factor > 0
  bool packed_sequences = false;    // packed_lengths: THD microbatches of several sequences (estimator/packing.h)
  bool hybrid_cp = false;           // hybrid_cp: CP only over the ranks a sequence's length needs
  bool uniform_groups = false;      // full recompute, uniform method with several layers per checkpoint
  uint16_t recompute_modules = 0;   // modules selective recompute may name
  bool exact_recompute_set = false; // only exactly `recompute_modules`
  uint8_t dispatchers = 0;          // 1 << MoeDispatcher
  uint8_t graph_impls = 0;          // 1 << GraphImpl
  uint8_t cp_comms = 0;             // 1 << CpComm
  uint8_t router_dtypes = 0;        // 1 << Dtype
  bool clips_gradients = true;      // scales gradients to a global norm every step (else computes the norm only)
  bool probs_in_activation = false; // weights routed copies in the experts' activation (no expert output kept)
  bool keeps_norm_input = true;     // keeps the pre-FFN norm's input and output (else rebuilds the output from the input)
  bool fused_norm_linears = false;  // norms fused into the linear after them, which layernorm recompute leaves alone
  bool moe_act_experts_only = false; // moe_act rebuilds the routed experts' activation only (else every MLP's)
  const char* linear_ce_note = "";  // which versions run linear CE ("" = all)
  // The framework's own limits and requirements on a model and plan ("" = runs): lcplan-exec's kernels, Megatron-LM's
  // argument checks between settings.
  std::string (*limits)(const ModelSpec&, const Plan&) = nullptr;
};

// What a plan that leaves a run setting unset gets (Plan::assumed): for megatron, Megatron-LM's argument defaults.
struct RunDefaults {
  OptimizerNumerics optimizer;
  LowPrecisionOptions fp8;
  uint16_t recompute_modules = kLegacySelectiveModules;
  CudaGraphs cuda_graphs;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  Routing routing = Routing::Forced;  // bumblebee's and lcplan-exec's plans assume balanced routing
  Dtype router_dtype = Dtype::FP32;
  bool permute_fusion = true;
  bool pad_to_capacity = true;
  bool dp_overlap = false;
  bool tp_overlap = false;
  CpComm cp = CpComm::P2P;
};

struct Framework {
  const char* name;
  const char* calibration;  // the per_implementation overrides it reads
  const char* launch;       // how its plans are launched: "megatron" (Megatron-LM flags) or "recipe" (recipe.json)
  const char* summary;
  Capabilities can;
  RunDefaults defaults;     // settings left unset, at load
  RunDefaults recommended;  // settings left unset, in a search: the fastest the framework runs
};

const std::vector<Framework>& frameworks();
// The framework of an implementation name; nullptr for a name no row has (a profile's own implementation).
const Framework* find_framework(const std::string& name);
// The per_implementation key whose overrides apply to `implementation` (its own name when no row names it).
std::string calibration_key(const std::string& implementation);

// One sentence naming the first field of `p` that `fw` cannot run and the frameworks that run it, or "".
std::string framework_support_error(const Framework& fw, const ModelSpec& m, const Plan& p);
// The same for the plan's own implementation ("" for a name no row has).
std::string framework_support_error(const ModelSpec& m, const Plan& p);

// The switches the time model applies: a plan's overlap and fusion switches where its framework has them. A framework
// without DP overlap switches leaves the distributed optimizer's collectives exposed (bumblebee's and lcplan-exec's
// are) and its FSDP prefetches as FSDP does; one without TP overlap or unfused permutation runs its own.
struct EffectiveSwitches {
  bool overlap_grad_reduce, overlap_param_gather;  // distributed optimizer / no sharding
  bool fsdp_reduce, fsdp_gather;                   // FSDP
  bool tp_overlap, permute_fusion;
  bool clip_gradients = true;                      // Capabilities::clips_gradients
};
EffectiveSwitches effective_switches(const Plan& p);

// Sets every field in `p.assumed` to the implementation's defaults (`recommended`: the search's choices for the
// performance switches instead), the aux-loss routing imbalance from `cal` (routing.aux_loss_imbalance), and clears
// `p.assumed`. Returns "field value" for each field it set, for `lcplan estimate`'s one line of assumed defaults.
std::vector<std::string> resolve_run_defaults(Plan& p, const ModelSpec& m, const Calibration& cal, bool recommended = false);
// The same values without clearing `p.assumed` (a plan read from a launch, before its calibration is known): the
// aux-loss routing imbalance keeps its value until then.
void apply_run_defaults(Plan& p, const ModelSpec& m);

}  // namespace lcplan
