// Named validity rules for a plan on a model. The estimator refuses a plan that breaks one (UserError with the
// rule's sentence); the search counts rejections per rule (--explain-rejects).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

enum class Rule : int {
  Positive,          // sizes and counts at least 1
  GpusDivisible,     // gpus divisible by tp*pp*cp
  TpHeads,           // attention / KV / linear-attention / MLA heads divisible by tp
  CpLinearHeads,     // gated DeltaNet heads per TP rank divisible by cp (head-parallel CP of linear attention)
  EpExperts,         // experts divisible by ep (ep = 1 on dense models)
  ExpertGroup,       // ep*etp divides the tp*cp*dp ranks of a stage
  EtpFfn,            // expert ffn divisible by etp
  LayersSplit,       // layers split over pp*vpp virtual stages (parallel/pipeline_split.h)
  VppNeedsPp,        // vpp > 1 only with pp > 1
  SeqDivisible,      // seq divisible by 2*cp*tp (load-balanced causal CP) or tp (sequence parallel)
  BatchDivisible,    // global batch divisible by micro_batch*dp
  MoeChunks,         // ep_chunks in 1..8, at most the tokens each rank routes; 1 on dense models
  MoeRouting,        // routing_imbalance >= 1, capacity_factor >= 0
  RecomputeLayers,   // recompute_layers within the layers of a virtual stage, only with full recompute
  A2aOverlap,        // cross-microbatch all-to-all overlap: MoE with ep > 1, pp = 1 or vpp > 1, no full recompute (Megatron's rules)
  RunSettings,       // run settings agree with each other and the model (routing, optimizer dtypes, modules, CP type)
  CudaGraphs,        // a CUDA graph scope and the settings it excludes
  Count
};

const char* rule_name(Rule r);

struct RuleViolation {
  Rule rule;
  std::string message;  // one sentence naming the value and what would be valid
};

// The plan's sizes and counts (gpus, seq_len, micro_batch and the parallel sizes at least 1, gpus in range): the
// Positive rule alone, which a search's base plan must pass before its layout is chosen.
std::optional<RuleViolation> check_plan_sizes(const Plan& p);

// First rule the plan breaks, or nothing. Pure and cheap: the search calls it for every candidate.
std::optional<RuleViolation> check_plan(const ModelSpec& m, const Plan& p);

// Throws UserError with the violation's sentence.
void require_valid_plan(const ModelSpec& m, const Plan& p);

}  // namespace lcplan
