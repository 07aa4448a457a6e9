// The derived record of a plan: every fact the memory model, the time model, the rules, the search and the emitters
// read, computed once (after Calculon's one list of layer records that memory and time both sum over).
//
// Glossary (README "Words"): local tokens = tokens of one microbatch on one rank's CP shard (seq * micro_batch /
// cp); hidden tokens = local tokens of hidden-sized tensors (local / tp under sequence parallelism); routed token
// copies = (token, expert) pairs the busiest rank's experts process; in-flight microbatches = microbatches whose
// saved activations a stage holds at its peak.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "estimator/flops.h"
#include "estimator/frameworks.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "models/model_spec.h"
#include "models/params.h"
#include "parallel/pipeline_split.h"
#include "parallel/rank_layout.h"

namespace lcplan {

// Sizes that need only the plan (the rules call these before a plan is known to be valid).
double local_tokens(const Plan& p);   // seq_len * micro_batch / cp
double hidden_tokens(const Plan& p);  // local_tokens / tp under sequence parallelism (tp > 1), else local_tokens
// Busiest rank's routed tokens over the mean: token dropping with padding pads every expert to its capacity (Megatron
// --moe-pad-expert-input-to-capacity), so capacity_factor; without padding the imbalance up to the capacity factor;
// dropless routing carries the imbalance.
// HybridEP's per-rank budget (moe.rank_capacity_factor) caps it the same way: what exceeds the budget is dropped.
double routed_load_factor(const Plan& p);
// The MoE layer's shapes are static, so a CUDA graph captures it and no host sync sizes its buffers: token dropping
// padded to capacity, or HybridEP's per-rank budget with the paged stash (megatron-settings.md section 4, "MoE").
bool static_moe_shapes(const Plan& p);

// Parameters of one layer (or FSDP unit) on this GPU, before optimizer/FSDP sharding.
struct UnitParams {
  double dense = 0;   // TP-sharded weights / tp plus replicated vectors (norms, router)
  double expert = 0;  // routed experts / (ep * etp)
};

// Saved activation bytes of one layer for one microbatch on this GPU.
struct LayerActivation {
  double saved = 0;       // kept on the device until the layer's backward under the plan's recompute mode
  double full = 0;        // everything the layer's backward needs (what recompute rebuilds)
  double moe_tokens = 0;  // the part of `full` that scales with routed tokens (chunked under chunked EP)
  double offloaded = 0;   // the part of `full` the plan's offloaded modules keep on the host (offload.modules)
};

// One distinct layer shape (mixer, FFN, sliding window): every layer of a kind weighs and costs the same.
struct LayerKind {
  LayerSpec spec;
  LayerFlops flops;             // forward model FLOPs of one sequence (routed experts: top_k copies per token)
  LayerTraffic traffic;         // GEMM input/output and activation elements per token (per routed copy)
  UnitParams params;
  LayerActivation when_recomputed;  // under full recompute: only the layer input is saved
  LayerActivation when_kept;        // under the plan's recompute mode otherwise (none or selective)
};

// One decoder layer (or MTP module body) of the plan: where it runs and how it is recomputed.
struct LayerRecord {
  int kind = 0;         // index into DerivedPlan::kinds
  int stage = 0;        // pipeline stage
  int vchunk = 0;       // virtual chunk on that stage
  int pos = 0;          // position in its virtual stage (what the block method's recompute_layers counts)
  bool recomputed = false;  // full recompute of this layer (Megatron block method: the first N of each chunk)
  double inflight = 1;  // microbatches whose activations of this layer the stage holds at its peak
  bool mtp = false;     // an MTP module's decoder layer (last stage, one microbatch in flight)
};

struct StageRecord {
  int layers = 0;              // decoder layers (all virtual chunks)
  double saved_activations = 0;  // sum over the stage's layer records of inflight x saved activation bytes
  uint64_t kinds_present = 0;  // bit 2*kind + recomputed for every (kind, recomputed) pair among its records
  UnitParams params;           // every unit on this stage: layers, embedding, LM head, final norm, MTP modules
  double max_unit = 0;         // largest FSDP unit on this stage (dense + expert), unsharded
  double inflight_sum = 0;     // sum of in-flight microbatches over the stage's decoder layers
  bool has_moe = false;
  // An earlier stage with the same layer records (kind and position, in order) and parameters, else this stage:
  // its costs are that stage's, its memory differs only by the activations it saves (the last stage, which runs
  // the loss, is never the same as another).
  int same_as = 0;
};

// A process group of the plan: members, nodes spanned by the widest group of its kind, link tier.
struct GroupFacts {
  int size = 1;
  int nodes = 1;
  LinkTier tier = LinkTier::NVLink;
};

struct DerivedPlan {
  const ModelSpec* model = nullptr;
  const Plan* plan = nullptr;

  // Batch and tokens.
  int dp = 1;                   // gpus / (tp*pp*cp)
  int edp = 1;                  // expert data parallel: tp*cp*dp / (ep*etp)
  int global_batch = 0;         // sequences per step
  int microbatches = 1;         // per DP rank per step
  double seq = 0;               // tokens per sequence
  double local_tokens = 0;      // see local_tokens()
  double hidden_tokens = 0;     // see hidden_tokens()
  double sequence_share = 0;    // this rank's share of one sequence's token work before TP: micro_batch / cp
  bool packed = false;          // the microbatch is packed from sequences of Plan::packed_lengths (THD)
  double attention_seq = 0;     // local sequence flash attention runs at: seq / cp; packed: sum L_i^2 / sum L_i / cp
  double causal_share = 1;      // share of this rank's attention FLOPs whose kernels run under a causal mask
  double cp_split_tokens = 0;   // local tokens of sequences split over CP ranks (their K/V is exchanged): local_tokens,
                                // less under hybrid CP (Plan::packed_splits: whole sequences exchange nothing)
  // Hybrid CP: per split size 2^i (i >= 1), this rank's local tokens of the sequences split over that many CP ranks,
  // each sequence's K/V exchanged in a ring of its own ranks; all zero otherwise (one ring of cp: cp_split_tokens).
  std::array<double, 17> split_ring_tokens{};
  bool sequence_parallel = false;
  double routed_tokens = 0;     // routed token copies on the busiest rank (hidden tokens * etp * top_k * load)
  double tokens_per_local_expert = 0;  // routed_tokens * ep / experts

  // Layout.
  RankLayout layout;
  int gpus_per_node = 8;
  GroupFacts tp, cp, ep, pp, dp_cp, edp_group;
  // The distributed optimizer's shard groups and the groups across its instances (optimizer.instances): dp_cp and
  // edp_group split into that many consecutive parts; the same groups as above with one instance.
  GroupFacts dp_shard, edp_shard, dp_instances, edp_instances;
  int communicators = 0;        // NCCL communicators this rank belongs to

  // Layers and stages.
  PipelineSplit split;
  std::vector<LayerKind> kinds;
  std::vector<LayerRecord> layers;  // decoder layers in order, then MTP modules
  std::vector<StageRecord> stages;
  // The stages whose memory can be the peak: of each group of alike stages (StageRecord::same_as) the one saving
  // the most activations (derive_options). The largest peak among them is the peak over all stages.
  std::vector<int> peak_stages;
  bool has_moe = false;
  int moe_chunks = 1;           // ep_chunks (1 on dense models)
  EffectiveSwitches switches{};  // the plan's overlap and fusion switches as its framework runs them
  double model_flops_per_step = 0;  // Megatron-style model FLOPs of one step (estimator/flops.h)
  // The recompute choice derive_options last derived the records for (layers -1: none yet).
  struct RecomputeChoice {
    Recompute mode = Recompute::None;
    int layers = -1;
    RecomputeMethod method = RecomputeMethod::Block;
    uint16_t modules = 0;
    bool operator==(const RecomputeChoice&) const = default;
  };
  RecomputeChoice derived_recompute;
};

// GPUs per NVLink domain: the plan's gpus_per_node, else the hardware profile's. The one derivation:
// DerivedPlan::gpus_per_node holds it and load_plan_inputs writes it into the plan it loads.
int nvlink_domain_gpus(const Plan& p, const Hardware& hw);

// The plan must be valid (check_plan). `hw` supplies the node size when the plan gives none.
DerivedPlan derive_plan(const ModelSpec& m, const Plan& p, const Hardware& hw);

// derive_plan in two steps, for callers that vary only the options within a layout (the search): derive_layout
// reads everything but ep_chunks and the recompute choice, derive_options those (again after the plan's change).
// derive_plan(m, p, hw) is derive_layout then derive_options, and either order of use gives the same record.
// `like`, a record derived before for another layout, lends what depends on neither the layout nor the options.
DerivedPlan derive_layout(const ModelSpec& m, const Plan& p, const Hardware& hw, const DerivedPlan* like = nullptr);
void derive_options(DerivedPlan& d);  // reads d.plan's moe.ep_chunks, recompute and recompute_layers

// Bytes per element of a GEMM input in the plan's precision (bf16 2; fp8 1; mxfp8 and nvfp4 with their block
// scales): how a low-precision recipe saves it for the weight gradient and dispatches it to the experts.
double gemm_input_bytes(Precision p, Fp8Recipe recipe = Fp8Recipe::Tensorwise);

// What selective recompute's `layernorm` and `moe_act` rebuild in a layer of `layer`'s kind, as the plan's framework
// builds it: the mixer's and the FFN's input norms, and the activation of MLPs other than the routed experts'.
struct RecomputeScope {
  bool mixer_norm = true, ffn_norm = true;  // under layernorm
  bool other_mlp_act = true;                // under moe_act: dense and shared-expert MLPs
};
RecomputeScope recompute_scope(const Plan& p, const LayerSpec& layer);

// Saved activations of one layer of `layer`'s kind for one microbatch (exposed for tests).
LayerActivation layer_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer, bool recomputed);
// The FFN part of it alone, from the pre-FFN norm's output on (a MoE layer benchmarked by itself).
LayerActivation ffn_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer);

}  // namespace lcplan
