// Run settings: what a real Megatron-LM run sets beyond the parallel layout that moves memory or time (gradient and
// optimizer dtypes, FP8 recipe, recompute modules, offloaded modules, CUDA graphs, overlap switches, context-parallel
// communication). Each is a plan field (estimator/plan.h) with its physics in the memory and time models; the names
// are Megatron-LM's (megatron/core/transformer/transformer_config.py, megatron/core/optimizer/optimizer_config.py,
// megatron/training/arguments.py, https://github.com/NVIDIA/Megatron-LM).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lcplan {

// Storage dtype of a tensor class.
enum class Dtype : uint8_t { FP32, BF16, FP16, FP8, FP64 };
const char* to_string(Dtype d);
double dtype_bytes(Dtype d);  // 4, 2, 2, 1, 8
// Parses `s` as one of `valid`; UserError "<what> \"<s>\" is not valid (valid: fp32, bf16)".
Dtype parse_dtype(const std::string& s, const std::string& what, const std::vector<Dtype>& valid);

// Gradient and optimizer numerics (Megatron-LM optimizer_config.py, distributed_data_parallel_config.py).
struct OptimizerNumerics {
  Dtype grad = Dtype::FP32;         // main-gradient buffer and its DP reduction (grad_reduce_in_fp32: fp32)
  Dtype main_params = Dtype::FP32;  // master weights (--main-params-dtype)
  Dtype exp_avg = Dtype::FP32;      // Adam first moment (--exp-avg-dtype)
  Dtype exp_avg_sq = Dtype::FP32;   // Adam second moment (--exp-avg-sq-dtype)
  bool precision_aware = false;     // --use-precision-aware-optimizer (TE FusedAdam): allows the dtypes above
  int instances = 1;                // distributed-optimizer instances (--num-distributed-optimizer-instances): the
                                    // state sharded over DP / instances, one copy per instance
  bool operator==(const OptimizerNumerics&) const = default;
};

// Scaling recipe of the fp8 precision (--fp8-recipe); mxfp8 and nvfp4 are precisions of their own.
enum class Fp8Recipe : uint8_t { Tensorwise, Delayed, Blockwise };
const char* to_string(Fp8Recipe r);
Fp8Recipe parse_fp8_recipe(const std::string& s);

struct LowPrecisionOptions {
  Fp8Recipe recipe = Fp8Recipe::Tensorwise;
  bool param_gather = false;  // --fp8-param-gather: weights kept in fp8, parameter all-gather in fp8
  bool attention = false;     // --fp8-dot-product-attention
  bool operator==(const LowPrecisionOptions&) const = default;
};

// A named bit of a module list (recompute, offload, CUDA graph modules).
struct ModuleName {
  const char* name;
  uint16_t bit;
};

// --recompute-modules (selective recompute).
enum RecomputeModule : uint16_t {
  kRecomputeCoreAttn = 1 << 0,       // core attention's softmax statistics
  kRecomputeLayernorm = 1 << 1,      // input_layernorm and pre_mlp_layernorm outputs (output-discarding)
  kRecomputeMlaUpProj = 1 << 2,      // MLA q/kv up-projections and RoPE (output-discarding)
  kRecomputeMoeAct = 1 << 3,         // MLP activation outputs (output-discarding)
  kRecomputeMlp = 1 << 4,            // the dense MLP
  kRecomputeMoe = 1 << 5,            // the whole MoE layer, dispatch included
  kRecomputeSharedExperts = 1 << 6,  // the shared experts
};
// lcplan's selective set before modules were a plan field (and what lcplan-exec runs): core_attn, layernorm, moe_act.
constexpr uint16_t kLegacySelectiveModules = kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMoeAct;
// Megatron-LM's default when --recompute-modules is absent (transformer_config.py __post_init__).
constexpr uint16_t kMegatronSelectiveModules = kRecomputeCoreAttn;
const std::vector<ModuleName>& recompute_module_names();

// --recompute-method: block recomputes the first recompute_layers layers of each virtual stage (0 = all); uniform
// keeps one checkpoint per recompute_layers layers and recomputes every layer.
enum class RecomputeMethod : uint8_t { Block, Uniform };
const char* to_string(RecomputeMethod m);
RecomputeMethod parse_recompute_method(const std::string& s);

// --offload-modules (fine-grained activation offloading): the module's input goes to host memory.
enum OffloadModule : uint16_t {
  kOffloadAttnNorm = 1 << 0,   // input_layernorm's input: the layer input
  kOffloadQkvLinear = 1 << 1,  // the QKV projection's input: the norm output
  kOffloadCoreAttn = 1 << 2,   // core attention's inputs: q, k, v
  kOffloadAttnProj = 1 << 3,   // the output projection's input: the attention output
  kOffloadMlpNorm = 1 << 4,    // the pre-MLP norm's input: the residual after the mixer
  kOffloadExpertFc1 = 1 << 5,  // the expert fc1 input: the dispatched tokens
  kOffloadMoeAct = 1 << 6,     // the expert activation's input: the fc1 output
};
const std::vector<ModuleName>& offload_module_names();

// --cuda-graph-impl and --cuda-graph-modules (cuda_graph_scope).
enum class GraphImpl : uint8_t { None, Local, TransformerEngine, FullIteration };
const char* to_string(GraphImpl g);
GraphImpl parse_graph_impl(const std::string& s);
enum GraphModule : uint16_t {
  kGraphAttn = 1 << 0,           // _forward_attention
  kGraphMlp = 1 << 1,            // the dense MLP
  kGraphMoe = 1 << 2,            // the MoE layer (drop-and-pad only)
  kGraphMoeRouter = 1 << 3,      // up to the router
  kGraphMoePreprocess = 1 << 4,  // the dispatcher's preprocessing (with moe_router)
};
const std::vector<ModuleName>& graph_module_names();

struct CudaGraphs {
  GraphImpl impl = GraphImpl::None;
  uint16_t modules = 0;  // local / transformer_engine: the captured modules; 0 = the whole layer
  bool operator==(const CudaGraphs&) const = default;
};

// --cp-comm-type.
enum class CpComm : uint8_t { P2P, AllGather, A2A, A2AP2P };
const char* to_string(CpComm c);
CpComm parse_cp_comm(const std::string& s);

// Communication overlap switches and context-parallel communication.
struct CommOptions {
  bool overlap_grad_reduce = true;   // --overlap-grad-reduce: bucketed DP reduce under the backward
  bool overlap_param_gather = true;  // --overlap-param-gather: sharded-parameter all-gather under the forward
  bool tp_overlap = false;           // --tp-comm-overlap: TE userbuffers AG/RS under the GEMMs
  CpComm cp = CpComm::P2P;
  int cp_a2a_size = 0;  // a2a+p2p: the all-to-all group (--hierarchical-context-parallel-sizes A P); 0 = unset
  bool operator==(const CommOptions&) const = default;
};

// MoE routing: forced balance (--moe-router-force-load-balancing, benchmarks) or an auxiliary-loss router.
enum class Routing : uint8_t { Forced, AuxLoss };
const char* to_string(Routing r);
Routing parse_routing(const std::string& s);

// Module lists: names <-> bits. Parse throws UserError "<what> \"x\" is not valid (valid: a, b, c)".
uint16_t parse_modules(const std::vector<std::string>& names, const std::vector<ModuleName>& table, const std::string& what);
std::vector<std::string> module_list(uint16_t bits, const std::vector<ModuleName>& table);
std::string module_text(uint16_t bits, const std::vector<ModuleName>& table);  // "core_attn,layernorm" ("none" when 0)

// The settings a plan may leave to its implementation's defaults (Plan::assumed), one bit each.
enum RunField : uint32_t {
  kFieldGradDtype = 1u << 0,
  kFieldOptimizerDtypes = 1u << 1,  // main params, moments, precision-aware optimizer
  kFieldFp8Recipe = 1u << 2,
  kFieldFp8ParamGather = 1u << 3,
  kFieldFp8Attention = 1u << 4,
  kFieldRecomputeModules = 1u << 5,
  kFieldCudaGraphs = 1u << 6,
  kFieldDispatcher = 1u << 7,
  kFieldRouting = 1u << 8,
  kFieldRoutingImbalance = 1u << 9,
  kFieldRouterDtype = 1u << 10,
  kFieldPermuteFusion = 1u << 11,
  kFieldPadToCapacity = 1u << 12,
  kFieldDpOverlap = 1u << 13,  // overlap_grad_reduce and overlap_param_gather
  kFieldTpOverlap = 1u << 14,
  kFieldCpComm = 1u << 15,
};
// The fields a recipe or lcplan's flags leave to the implementation when absent. Dispatcher, recompute modules and
// padding keep the meaning their keys had before (alltoall, lcplan's selective set, padded): only a Megatron launch
// leaves them to Megatron's defaults.
constexpr uint32_t kPlanDefaultFields = kFieldGradDtype | kFieldOptimizerDtypes | kFieldFp8Recipe | kFieldFp8ParamGather |
                                        kFieldFp8Attention | kFieldCudaGraphs | kFieldRouting | kFieldRoutingImbalance |
                                        kFieldRouterDtype | kFieldPermuteFusion | kFieldDpOverlap | kFieldTpOverlap |
                                        kFieldCpComm;
constexpr uint32_t kAllRunFields = kPlanDefaultFields | kFieldRecomputeModules | kFieldDispatcher | kFieldPadToCapacity;

}  // namespace lcplan
