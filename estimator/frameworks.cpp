#include "estimator/frameworks.h"

#include <cstdio>

namespace lcplan {

namespace {

constexpr uint8_t bit(MoeDispatcher d) { return uint8_t(1u << static_cast<int>(d)); }
constexpr uint8_t bit(GraphImpl g) { return uint8_t(1u << static_cast<int>(g)); }
constexpr uint8_t bit(CpComm c) { return uint8_t(1u << static_cast<int>(c)); }
constexpr uint8_t bit(Dtype t) { return uint8_t(1u << static_cast<int>(t)); }
constexpr uint16_t kAllRecomputeModules = 0x7f;

// lcplan-exec's kernels (executor/README.md): what its layers and schedule run beyond the plan's fields.
std::string lcplan_exec_kernel_limits(const ModelSpec& m, const Plan& p) {
  const Parallel& q = p.parallel;
  if (q.tp > 1 && !p.sequence_parallel)
    return "lcplan-exec runs tensor parallelism with sequence parallelism only but the plan has tp = " +
           std::to_string(q.tp) + " and sequence_parallel = false (set it to true)";
  if (q.tp > 1 && m.vocab % q.tp != 0)
    return "the vocabulary of " + std::to_string(m.vocab) + " does not split over tp = " + std::to_string(q.tp) +
           " ranks (Megatron pads it to a multiple of tp; scale the model with --scale, whose vocabulary rule keeps it "
           "divisible)";
  if (q.tp > 1 && m.dense_ffn % q.tp != 0)
    return "the dense FFN width " + std::to_string(m.dense_ffn) + " does not split over tp = " + std::to_string(q.tp);
  if (q.tp > 1 && (m.moe.shared_experts * m.moe.shared_ffn) % q.tp != 0)
    return "the shared-expert width " + std::to_string(m.moe.shared_experts * m.moe.shared_ffn) +
           " does not split over tp = " + std::to_string(q.tp);
  // Megatron-LM's interleaved schedule runs microbatches in groups of pp (or microbatch_group) per virtual stage
  // (schedules.py): with a partial last group its order can wait forever (executor/schedule.h simulate_pipeline).
  const int group = microbatch_group_size(p);
  if (q.vpp > 1 && num_microbatches(p) % group != 0)
    return "the interleaved pipeline schedule needs the microbatches per step (" +
           std::to_string(num_microbatches(p)) + " = global_batch / (micro_batch x dp)) to be a multiple of its group of " +
           std::to_string(group) + (p.microbatch_group > 0 ? " (pipeline.microbatch_group)" : " (pp)") +
           "; change global_batch";
  // q/k/v biases run (GLM-4.5); the parameter counts (models/params.cpp) have no bias on an output gate's columns.
  if (m.attn.sinks || m.attn.o_bias || (m.attn.qkv_bias && m.attn.output_gate))
    return "model " + m.name + " has an o_proj bias, softmax sinks or q/k/v biases with an output gate, which "
           "lcplan-exec lacks (it runs q/k/v biases on attention without an output gate)";
  if (!m.gated_mlp)
    return "model " + m.name + " has a two-matrix (non-gated) MLP, which lcplan-exec lacks (it runs SwiGLU MLPs)";
  if (m.moe.expert_bias)
    return "model " + m.name + " has biased expert layers, which lcplan-exec lacks (its MoE layer has bias-free experts)";
  if (m.moe.latent > 0)
    return "model " + m.name + " has latent MoE (latent width " + std::to_string(m.moe.latent) +
           "), which lcplan-exec lacks (its experts work in the hidden width)";
  if (m.layers.empty()) return "model " + m.name + " has no decoder layers";
  // Its packed microbatches split every sequence over all CP ranks (executor/layers/common.h for_each_sequence).
  if (!p.packed_splits.empty())
    return "lcplan-exec splits every packed sequence over all cp ranks but the plan has packed_splits (hybrid context "
           "parallelism's busiest rank; drop packed_splits to run it with regular context parallelism)";
  return "";
}

// Megatron-LM's checks between settings (megatron/training/arguments.py validate_args, Megatron-Bridge comm_overlap.py):
// optimizer offload needs the precision-aware optimizer and excludes fp8 parameters.
std::string megatron_requirements(const ModelSpec& m, const Plan& p) {
  if (p.parallel.ep > 1 && p.parallel.tp > 1 && !p.sequence_parallel && m.moe.num_experts > 0)
    return "sequence_parallel = false with ep = " + std::to_string(p.parallel.ep) + " and tp = " +
           std::to_string(p.parallel.tp) + " (Megatron-LM requires sequence parallelism with expert and tensor "
           "parallelism; set it true)";
  if (p.offload.optimizer && !p.optimizer.precision_aware)
    return "offload.optimizer needs optimizer.precision_aware = true (Megatron-LM runs --optimizer-cpu-offload only with "
           "--use-precision-aware-optimizer; set it, or offload.optimizer false)";
  if (p.offload.optimizer && p.fp8.param_gather && p.precision != Precision::BF16)
    return "offload.optimizer contradicts fp8.param_gather (Megatron-LM refuses --optimizer-cpu-offload with "
           "--fp8-param-gather; give one)";
  // Megatron-LM arguments.py: the hybrid CP scheduler runs without pipeline parallelism and without CUDA graphs.
  if (p.hybrid_cp && p.parallel.pp > 1)
    return "hybrid_cp needs parallel.pp = 1 (Megatron-LM's --hybrid-context-parallel runs without pipeline "
           "parallelism; set pp 1 or hybrid_cp false)";
  if (p.hybrid_cp && (p.parallel.cp & (p.parallel.cp - 1)) != 0)
    return "hybrid_cp needs parallel.cp a power of two (Megatron-LM's hybrid CP groups are powers of two; cp = " +
           std::to_string(p.parallel.cp) + ")";
  if (p.hybrid_cp && p.cuda_graphs.impl != GraphImpl::None)
    return "hybrid_cp needs cuda_graphs none (Megatron-LM's --hybrid-context-parallel runs without CUDA graphs; "
           "give one)";
  return "";
}

Capabilities megatron_capabilities() {
  Capabilities c;
  c.limits = megatron_requirements;
  c.ep_overlap = c.dp_overlap = c.tp_overlap = c.unfused_permute = c.linear_ce = c.low_precision = c.fp8_extras = true;
  c.optimizer_offload = c.partial_optimizer_offload = c.activation_offload = c.module_offload = true;
  c.offload_needs_precision_aware = true;
  c.optimizer_dtypes = c.bf16_grads = c.token_dropping = c.uniform_groups = true;
  c.packed_sequences = true;  // THD with cu_seqlens (PackedSeqParams; megatron/training/training.py counts sum L_i^2)
  c.hybrid_cp = true;         // --hybrid-context-parallel with the BalancedCPScheduler (arguments.py)
  c.recompute_modules = kAllRecomputeModules;
  c.dispatchers = bit(MoeDispatcher::AllToAll) | bit(MoeDispatcher::AllGather) | bit(MoeDispatcher::DeepEP) | bit(MoeDispatcher::HybridEP);
  c.graph_impls = bit(GraphImpl::None) | bit(GraphImpl::Local) | bit(GraphImpl::TransformerEngine) | bit(GraphImpl::FullIteration);
  c.cp_comms = bit(CpComm::P2P) | bit(CpComm::AllGather) | bit(CpComm::A2A) | bit(CpComm::A2AP2P);
  c.router_dtypes = bit(Dtype::BF16) | bit(Dtype::FP32) | bit(Dtype::FP64);
  // The dispatchers carry each copy's routing weight to the experts, whose activation applies it (experts.py
  // permuted_probs, weighted_bias_swiglu); the combine unpermutes unweighted (token_dispatcher.py), Megatron-LM@d98e8a64ddf3.
  c.probs_in_activation = true;
  // Transformer Engine's LayerNormLinear fuses the input norm into QKV (not MLA's, which two down-projections read)
  // and a dense MLP's norm into fc1; `layernorm` rebuilds only norms that are modules of their own (transformer_layer.py:
  // not an IdentityOp), and `moe_act` only the grouped experts' activation (megatron-settings.md: requires grouped GEMM).
  c.fused_norm_linears = c.moe_act_experts_only = true;
  // Megatron-LM PRs #2256, #2739 (linear CE) and #3345 (Hopper kernels), https://github.com/NVIDIA/Megatron-LM.
  c.linear_ce_note = "Megatron-LM's development branch with --cross-entropy-fusion-impl linear (PRs #2256, #2739, #3345)";
  return c;
}

// Megatron-LM's defaults where a flag is absent (megatron/training/arguments.py and the config dataclasses it is
// generated from, Megatron-LM@d98e8a64ddf3): fp32 gradient accumulation under --bf16 (validate_args), fp32 optimizer
// state, the delayed fp8 recipe, selective recompute of core_attn, no CUDA graphs, the allgather dispatcher, aux-loss
// routing, the model's dtype in the router, unfused permutation, no padding to capacity, no overlap, p2p CP.
RunDefaults megatron_defaults() {
  RunDefaults d;
  d.fp8.recipe = Fp8Recipe::Delayed;
  d.recompute_modules = kMegatronSelectiveModules;
  d.dispatcher = MoeDispatcher::AllGather;
  d.routing = Routing::AuxLoss;
  d.router_dtype = Dtype::BF16;
  d.permute_fusion = false;
  d.pad_to_capacity = false;
  return d;
}

// What a search sets when the user leaves a performance switch unset: the overlaps and fusions Megatron-LM runs.
RunDefaults megatron_recommended() {
  RunDefaults d = megatron_defaults();
  d.dispatcher = MoeDispatcher::AllToAll;
  d.permute_fusion = true;
  d.dp_overlap = d.tp_overlap = true;
  return d;
}

// Megatron-Bridge performance recipes (src/megatron/bridge/perf_recipes/_common.py, Megatron-Bridge@067f987df03b):
// grad_reduce_in_fp32 False, overlap_grad_reduce / overlap_param_gather on with DP, fp8 current scaling with fp8
// parameters, force-balanced routing, an fp32 router, fused permutation, layernorm + moe_act selective recompute,
// the alltoall dispatcher; TP communication overlap only where a recipe sets it (Llama3-70B's), Megatron's default
// otherwise.
RunDefaults bridge_defaults() {
  RunDefaults d = megatron_recommended();
  d.tp_overlap = false;
  d.optimizer.grad = Dtype::BF16;
  d.fp8.recipe = Fp8Recipe::Tensorwise;
  d.fp8.param_gather = true;
  d.recompute_modules = kRecomputeLayernorm | kRecomputeMoeAct;
  d.routing = Routing::Forced;
  d.router_dtype = Dtype::FP32;
  return d;
}

Capabilities bumblebee_capabilities() {
  Capabilities c;
  c.chunked_ep = c.linear_ce = c.low_precision = true;
  c.optimizer_offload = c.activation_offload = c.token_dropping = true;
  c.packed_sequences = true;  // an RL trainer of rollouts of varying length (the article, section 1) on TE attention
  c.recompute_modules = kAllRecomputeModules;
  c.dispatchers = bit(MoeDispatcher::AllToAll);
  c.graph_impls = bit(GraphImpl::None);
  c.cp_comms = bit(CpComm::P2P);
  c.router_dtypes = bit(Dtype::FP32);
  return c;
}

Capabilities lcplan_exec_capabilities() {
  Capabilities c;
  c.chunked_ep = c.linear_ce = true;
  c.clips_gradients = false;  // Adam without clipping; the step reports the gradient norm (executor/README.md)
  c.keeps_norm_input = false;  // keeps the residual after the mixer and rebuilds the norm from it (decoder_layer.h)
  c.packed_sequences = true;  // THD segments, each split over CP by itself (no packed_splits: its limits say so)
  c.recompute_modules = kLegacySelectiveModules;
  c.exact_recompute_set = true;
  c.dispatchers = bit(MoeDispatcher::AllToAll);
  c.graph_impls = bit(GraphImpl::None);
  c.cp_comms = bit(CpComm::P2P);
  c.router_dtypes = bit(Dtype::FP32);
  c.limits = lcplan_exec_kernel_limits;
  return c;
}

// lcplan's plan defaults: what bumblebee's and lcplan-exec's plans held before run settings were fields.
RunDefaults plain_defaults() { return RunDefaults{}; }

}  // namespace

const std::vector<Framework>& frameworks() {
  static const std::vector<Framework> table = {
      {"megatron", "megatron", "megatron", "Megatron-LM (https://github.com/NVIDIA/Megatron-LM) with its argument defaults",
       megatron_capabilities(), megatron_defaults(), megatron_recommended()},
      {"megatron-bridge", "megatron", "megatron",
       "Megatron-LM driven by a Megatron-Bridge performance recipe (https://github.com/NVIDIA-NeMo/Megatron-Bridge)",
       megatron_capabilities(), bridge_defaults(), bridge_defaults()},
      // The article's framework: chunked EP, no cross-microbatch overlap; its DP collectives ran exposed (article
      // section 2.4 traces).
      {"bumblebee", "bumblebee", "recipe", "the article's framework (chunked EP; exposed DP collectives)",
       bumblebee_capabilities(), plain_defaults(), plain_defaults()},
      {"lcplan-exec", "lcplan-exec", "recipe", "this repository's executor (executor/README.md)", lcplan_exec_capabilities(),
       plain_defaults(), plain_defaults()},
  };
  return table;
}

const Framework* find_framework(const std::string& name) {
  for (const Framework& f : frameworks())
    if (name == f.name) return &f;
  return nullptr;
}

std::string calibration_key(const std::string& implementation) {
  const Framework* f = find_framework(implementation);
  return f ? f->calibration : implementation;
}

EffectiveSwitches effective_switches(const Plan& p) {
  EffectiveSwitches s{p.comm.overlap_grad_reduce, p.comm.overlap_param_gather, p.comm.overlap_grad_reduce,
                      p.comm.overlap_param_gather, p.comm.tp_overlap, p.moe.permute_fusion};
  if (const Framework* f = find_framework(p.implementation)) {
    s.overlap_grad_reduce = s.overlap_grad_reduce && f->can.dp_overlap;
    s.overlap_param_gather = s.overlap_param_gather && f->can.dp_overlap;
    s.fsdp_reduce = s.fsdp_reduce || !f->can.dp_overlap;
    s.fsdp_gather = s.fsdp_gather || !f->can.dp_overlap;
    s.tp_overlap = s.tp_overlap && f->can.tp_overlap;
    s.permute_fusion = s.permute_fusion || !f->can.unfused_permute;
    s.clip_gradients = f->can.clips_gradients;
  }
  return s;
}

}  // namespace lcplan
