// Plan: one parallel recipe (the recipe.json record). dp is derived, never given.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/batch_spec.h"
#include "estimator/run_settings.h"
#include "parallel/pipeline_split.h"

namespace lcplan {

struct ModelSpec;

// GEMM number format of the training recipe (Megatron-LM/Transformer Engine recipes): bf16; fp8 with per-tensor
// (delayed or current) scaling; mxfp8 with 32-element block scales; nvfp4 with 16-element block scales (Blackwell).
enum class Precision : uint8_t { BF16, FP8, MXFP8, NVFP4 };
enum class OptimizerSharding : uint8_t { None, DistOpt, Fsdp };
enum class Recompute : uint8_t { None, Selective, Full };

struct Parallel {
  int tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1;
};

struct Offload {
  bool optimizer = false;
  bool activations = false;          // every layer's saved activations (Megatron --cpu-offloading)
  double optimizer_fraction = 1.0;   // with `optimizer`: the share of the optimizer state and step on the host
  uint16_t modules = 0;              // fine-grained offloading: OffloadModule bits whose inputs go to the host
  double modules_fraction = 1.0;     // with `modules`: the share of their inputs moved (Megatron
                                     // --activation-offload-fraction, a share of the eligible groups, read as bytes)
};

// Megatron-LM's token dispatchers: alltoall (NCCL all-to-all-v, every routed copy sent, bf16), allgather (every rank
// gathers the EP group's tokens, the default), or flex with DeepEP (https://github.com/deepseek-ai/DeepEP: a token
// crosses the network once per destination node and is forwarded over NVLink; the dispatch carries the fp8 expert
// input in low-precision recipes) or HybridEP (NVIDIA's, costed as DeepEP's bytes, one NVLink domain across NVL72).
enum class MoeDispatcher : uint8_t { AllToAll, AllGather, DeepEP, HybridEP };
const char* to_string(MoeDispatcher d);
MoeDispatcher parse_dispatcher(const std::string& s);
inline bool deduplicating(MoeDispatcher d) { return d == MoeDispatcher::DeepEP || d == MoeDispatcher::HybridEP; }

struct MoeOptions {
  int ep_chunks = 1;               // chunked EP overlap: the MoE layer's tokens split into this many chunks
  double routing_imbalance = 1.0;  // busiest rank's tokens / mean (1 = force-balanced routing)
  double capacity_factor = 0;      // 0 = dropless; > 0 = token dropping at this capacity factor
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;  // how tokens reach the experts (Megatron --moe-token-dispatcher-type)
  bool a2a_overlap = false;        // all-to-all of one microbatch overlapped with another's compute (Megatron
                                   // --overlap-moe-expert-parallel-comm --delay-wgrad-compute)
  Routing routing = Routing::AuxLoss;  // an auxiliary-loss router at routing_imbalance, or forced balance (imbalance 1)
  Dtype router_dtype = Dtype::FP32;   // router logits and probabilities (--moe-router-dtype; absent: the model's bf16)
  bool permute_fusion = true;         // fused permute/unpermute kernels (--moe-permute-fusion)
  bool pad_to_capacity = true;        // token dropping: experts padded to capacity (--moe-pad-expert-input-to-capacity)
  double rank_capacity_factor = 0;    // HybridEP: a rank receives at most this x its balanced routed copies, the rest
                                      // dropped (--moe-expert-rank-capacity-factor; 0 = no budget)
  bool paged_stash = false;           // expert activations in a paged stash, so the budgeted HybridEP layer has static
                                      // buffers (--moe-paged-stash)
};

struct Plan {
  std::string model;                    // zoo name or config.json path
  std::string hardware = "h100-sxm-80gb";
  int gpus = 0;
  int gpus_per_node = 0;                // 0 = the hardware profile's node size
  int64_t seq_len = 0;                  // tokens per sequence
  int micro_batch = 1;                  // sequences per microbatch
  // A packed (THD) microbatch: the lengths of the sequences packed in it, each attending only to itself; empty = the
  // micro_batch sequences of seq_len tokens each. Non-empty: micro_batch 1 and seq_len their sum (estimator/packing.h).
  std::vector<int64_t> packed_lengths;
  // Hybrid CP's view of a packed microbatch (estimator/packing.h hybrid_cp_busiest_rank): per packed_lengths entry, the
  // CP ranks that sequence is split over (a power of two dividing cp); empty = every sequence over all cp ranks.
  std::vector<int> packed_splits;
  // Variable-length batches (estimator/packing.h): the run's sequence lengths and their packing; null = every sequence
  // is seq_len tokens. seq_len is then the longest padded sequence. A microbatch's own plan has none.
  std::shared_ptr<const BatchSpec> batches;
  // Hybrid context parallelism (Megatron-LM --hybrid-context-parallel): with batches, a sequence is split over only
  // the CP ranks its length needs (a power of two of them), shorter ones run whole on one rank (estimator/packing.h).
  bool hybrid_cp = false;
  int global_batch = 0;                 // sequences per step; 0 = one sequence per GPU, rounded up to whole microbatches
  Precision precision = Precision::BF16;
  Parallel parallel;
  PipelineLayout pipeline;              // uneven pipeline stages (empty = Megatron's automatic split)
  // Interleaved schedule: microbatches per group that run one virtual chunk before the next (Megatron-LM
  // --microbatch-group-size-per-virtual-pipeline-stage); 0 = pp, Megatron's depth-first default.
  int microbatch_group = 0;
  bool sequence_parallel = true;        // Megatron SP (only meaningful with tp > 1)
  OptimizerSharding optimizer_sharding = OptimizerSharding::DistOpt;
  Recompute recompute = Recompute::None;
  int recompute_layers = 0;             // full recompute: block: layers per virtual stage (0 = all); uniform: layers per checkpoint
  RecomputeMethod recompute_method = RecomputeMethod::Block;
  uint16_t recompute_modules = kLegacySelectiveModules;  // selective recompute: RecomputeModule bits
  // Full recompute without sequence parallelism: each checkpoint's input split over the TP ranks and all-gathered
  // before its replay (Megatron-LM --distribute-saved-activations, tensor_parallel/random.py CheckpointFunction).
  bool distribute_saved_activations = false;
  Offload offload;
  bool linear_ce = false;
  int mtp_layers = -1;                  // multi-token-prediction modules trained (Megatron --mtp-num-layers); -1 = the model's
  MoeOptions moe;
  OptimizerNumerics optimizer;          // gradient and optimizer-state dtypes
  LowPrecisionOptions fp8;              // the fp8 recipe, fp8 parameters, fp8 attention (low-precision plans)
  CudaGraphs cuda_graphs;
  CommOptions comm;                     // DP / TP overlap switches, CP communication
  std::string implementation = "megatron";  // the framework that runs the plan (estimator/frameworks.h)
  // RunField bits (estimator/run_settings.h) the plan left unset: resolve_run_defaults (estimator/frameworks.h) sets
  // them to the implementation's defaults when the plan's inputs are loaded. 0 for a plan built in code.
  uint32_t assumed = 0;
};

// The model the plan trains: `m` with the plan's MTP module count applied (when the plan gives one).
ModelSpec model_for_plan(ModelSpec m, const Plan& p);

// Derived sizes every consumer needs; computed once from a valid plan.
int data_parallel(const Plan& p);           // gpus / (tp*pp*cp)
int num_microbatches(const Plan& p);        // global_batch / (micro_batch * dp)
int microbatch_group_size(const Plan& p);   // the interleaved schedule's microbatch group: microbatch_group, else pp
int layers_per_checkpoint(const Plan& p);   // full recompute: recompute_layers under the uniform method, else 1
int effective_global_batch(const Plan& p);  // global_batch, or the default when 0: one sequence per GPU, rounded up to whole microbatches

const char* to_string(Precision v);
const char* to_string(OptimizerSharding v);
const char* to_string(Recompute v);

// Parsers for flag and JSON values; throw UserError naming the value and the valid choices.
Precision parse_precision(const std::string& s);
OptimizerSharding parse_optimizer_sharding(const std::string& s);
Recompute parse_recompute(const std::string& s);

// "128k" -> 131072, "1.5M" -> 1572864, "64K" -> 65536, "4096" -> 4096 (k = 1024, m = 1024^2, g = 1024^3).
// Throws UserError for anything else (empty, negative, zero, fractional result, unknown suffix, overflow).
int64_t parse_size(const std::string& text, const std::string& what);

// recipe.json <-> Plan. Unknown keys and wrongly-typed values throw UserError naming the key.
Plan plan_from_json(const nlohmann::json& j);
nlohmann::json plan_to_json(const Plan& p);

// Recipe files travel: a model or hardware given as a relative path (a config.json, a hardware JSON) is stored
// relative to the recipe file's folder and read back relative to it, so `estimate --plan` works from anywhere.
// (A file written before this rule, whose path was relative to where the search ran, is still read from there when
// nothing exists beside the recipe.) Zoo and profile names are kept as they are.
Plan load_plan_file(const std::string& path);
void write_plan_file(const std::string& path, const Plan& p);
// The reading half for any file that holds plans (recipes, measurement files): model and hardware paths stored
// relative to `dir` (that file's folder) become paths the working directory can open.
void resolve_plan_paths(Plan& p, const std::string& dir);

}  // namespace lcplan
