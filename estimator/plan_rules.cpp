#include "estimator/plan_rules.h"

#include <algorithm>
#include <cstdio>

#include "estimator/derived_plan.h"
#include "parallel/pipeline_split.h"
#include "parallel/chunk_schedule.h"
#include "common/user_error.h"

namespace lcplan {

const char* rule_name(Rule r) {
  switch (r) {
    case Rule::Positive: return "positive_sizes";
    case Rule::GpusDivisible: return "gpus_divisible_by_tp_pp_cp";
    case Rule::TpHeads: return "tp_divides_heads";
    case Rule::CpLinearHeads: return "cp_divides_linear_attention_heads";
    case Rule::EpExperts: return "ep_divides_experts";
    case Rule::ExpertGroup: return "ep_etp_fit_stage_group";
    case Rule::EtpFfn: return "etp_divides_expert_ffn";
    case Rule::LayersSplit: return "layers_split_over_pp_vpp";
    case Rule::VppNeedsPp: return "vpp_needs_pp";
    case Rule::SeqDivisible: return "seq_divisible_for_cp_tp";
    case Rule::BatchDivisible: return "global_batch_divisible";
    case Rule::MoeChunks: return "ep_chunks_valid";
    case Rule::MoeRouting: return "moe_routing_valid";
    case Rule::RecomputeLayers: return "recompute_layers_valid";
    case Rule::A2aOverlap: return "a2a_overlap_valid";
    case Rule::RunSettings: return "run_settings_valid";
    case Rule::CudaGraphs: return "cuda_graphs_valid";
    case Rule::Count: break;
  }
  return "?";
}

namespace {

bool has_kind(const ModelSpec& m, MixerKind k) {
  for (const auto& l : m.layers)
    if (l.mixer == k) return true;
  return false;
}
bool has_moe(const ModelSpec& m) {
  for (const auto& l : m.layers)
    if (l.ffn == FfnKind::MoE) return true;
  return false;
}

std::string divisors(long n, long cap = 1 << 20) {
  std::string s;
  for (long d = 1; d <= n && d <= cap; ++d)
    if (n % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

std::optional<RuleViolation> fail(Rule r, std::string msg) { return RuleViolation{r, std::move(msg)}; }

// Routing, optimizer state dtypes, recompute and offload modules, context-parallel communication: Megatron-LM's
// checks (transformer_config.py __post_init__, optimizer_config.py, arguments.py), each one sentence.
std::optional<RuleViolation> run_settings_rule(const ModelSpec& m, const Plan& p) {
  const Rule r = Rule::RunSettings;
  if (p.moe.routing == Routing::Forced && p.moe.routing_imbalance != 1.0)
    return fail(r, "moe.routing forced balances the experts, so routing_imbalance must be 1 (got " +
                       std::to_string(p.moe.routing_imbalance) + "; use routing aux_loss for an imbalance)");
  const OptimizerNumerics& o = p.optimizer;
  if (!o.precision_aware && (o.main_params != Dtype::FP32 || o.exp_avg != Dtype::FP32 || o.exp_avg_sq != Dtype::FP32))
    return fail(r, "optimizer state dtypes other than fp32 need optimizer.precision_aware = true (Megatron-LM's "
                   "--use-precision-aware-optimizer)");
  if (o.instances < 1 || o.instances > 1024)
    return fail(r, "optimizer.instances = " + std::to_string(o.instances) + " is out of range (valid: 1 to 1024)");
  if (o.instances > 1) {
    const Parallel& q = p.parallel;
    const int dp_cp = p.gpus / (q.tp * q.pp), edp = dp_cp * q.tp / (q.ep * q.etp);
    if (p.optimizer_sharding != OptimizerSharding::DistOpt)
      return fail(r, "optimizer.instances = " + std::to_string(o.instances) + " shards the distributed optimizer, but the "
                     "plan's sharding is " + to_string(p.optimizer_sharding) + " (valid: dist_opt, or instances 1)");
    if (dp_cp % o.instances != 0 || edp % o.instances != 0)
      return fail(r, "optimizer.instances = " + std::to_string(o.instances) + " must divide the data-parallel group (" +
                         std::to_string(dp_cp) + " ranks with cp) and the expert data-parallel group (" +
                         std::to_string(edp) + ")");
  }
  if (p.offload.optimizer && !(p.offload.optimizer_fraction > 0 && p.offload.optimizer_fraction <= 1))
    return fail(r, "offload.optimizer_fraction = " + std::to_string(p.offload.optimizer_fraction) +
                       " is out of range (valid: above 0, up to 1)");
  if (!(p.offload.modules_fraction > 0 && p.offload.modules_fraction <= 1) || (p.offload.modules_fraction != 1 && !p.offload.modules))
    return fail(r, "offload.modules_fraction = " + std::to_string(p.offload.modules_fraction) +
                       " is not valid (valid: above 0, up to 1, and other than 1 only with offload.modules)");
  if (p.offload.modules && p.offload.activations)
    return fail(r, "offload.modules contradicts offload.activations (Megatron-LM's fine-grained offloading cannot be "
                   "combined with --cpu-offloading; give one)");
  if ((p.offload.modules & kOffloadAttnProj) && !(p.offload.modules & kOffloadCoreAttn))
    return fail(r, "offload module attn_proj needs core_attn offloaded too (Megatron-LM offloads them together)");
  if (p.recompute == Recompute::Selective) {
    if (!p.recompute_modules)
      return fail(r, "selective recompute needs at least one module (valid: " +
                         module_text(0x7f, recompute_module_names()) + ")");
    if ((p.recompute_modules & kRecomputeMlaUpProj) && !has_kind(m, MixerKind::MLA))
      return fail(r, "recompute module mla_up_proj needs an MLA model (" + m.name + " has none; valid: core_attn, layernorm, "
                     "moe_act, mlp, moe, shared_experts)");
    if (p.precision == Precision::FP8 && p.fp8.recipe == Fp8Recipe::Delayed &&
        (p.recompute_modules & (kRecomputeMoeAct | kRecomputeLayernorm)))
      return fail(r, "recompute modules moe_act and layernorm do not run with the delayed fp8 recipe (Megatron-LM "
                     "refuses them; use fp8 recipe tensorwise or drop them)");
  }
  const Parallel& q = p.parallel;
  if (q.cp > 1 && p.comm.cp == CpComm::A2AP2P &&
      (p.comm.cp_a2a_size < 2 || p.comm.cp_a2a_size >= q.cp || q.cp % p.comm.cp_a2a_size != 0))
    return fail(r, "comm.cp a2a+p2p needs cp_a2a_size, a divisor of cp = " + std::to_string(q.cp) +
                       " between 2 and cp / 2 (--hierarchical-context-parallel-sizes A P with A x P = cp)");
  const int a2a = p.comm.cp == CpComm::A2A ? q.cp : p.comm.cp == CpComm::A2AP2P ? p.comm.cp_a2a_size : 1;
  if (q.cp > 1 && a2a > 1 && has_kind(m, MixerKind::FullAttention) && (m.attn.kv_heads / q.tp) % a2a != 0)
    return fail(r, "comm.cp " + std::string(to_string(p.comm.cp)) + " splits heads over " + std::to_string(a2a) +
                       " ranks but the " + std::to_string(m.attn.kv_heads / q.tp) + " KV heads per TP rank do not divide "
                       "(use p2p, or a cp that divides them)");
  return std::nullopt;
}

// CUDA graphs: a scope needs an impl, a MoE layer is capturable only with padded token dropping, layer-level
// offloading is blocked by graphs, and fine-grained offloading under TE graphs needs attn and moe_router captured and
// no norm offloaded (Megatron-LM docs/user-guide/features/cuda_graph.md, fine_grained_activation_offloading.md).
std::optional<RuleViolation> cuda_graph_rule(const ModelSpec& m, const Plan& p) {
  const CudaGraphs& g = p.cuda_graphs;
  const Rule r = Rule::CudaGraphs;
  if (g.impl == GraphImpl::None) {
    if (g.modules) return fail(r, "cuda_graphs.modules " + module_text(g.modules, graph_module_names()) +
                                      " needs an impl (valid: local, transformer_engine)");
    return std::nullopt;
  }
  if (g.impl == GraphImpl::FullIteration && g.modules)
    return fail(r, "cuda_graphs.modules " + module_text(g.modules, graph_module_names()) +
                       " contradicts impl full_iteration (it captures the whole iteration; give no modules)");
  const bool moe = has_moe(m);
  const bool captures_moe = g.impl == GraphImpl::FullIteration || g.modules == 0 || (g.modules & kGraphMoe);
  if (moe && captures_moe && !static_moe_shapes(p))
    return fail(r, std::string("cuda_graphs ") + (g.modules & kGraphMoe ? "module moe" : g.impl == GraphImpl::FullIteration ? "full_iteration" : "of the whole layer") +
                       " captures a dropless MoE layer, which is not capturable (set a capacity_factor with "
                       "pad_to_capacity, or HybridEP's rank_capacity_factor with paged_stash, or capture attn, "
                       "moe_router, moe_preprocess)");
  if (p.offload.activations)
    return fail(r, "cuda_graphs contradicts offload.activations (layer-level CPU offloading is blocked by CUDA graphs; "
                   "give one)");
  if (p.offload.modules && g.impl == GraphImpl::TransformerEngine) {
    if (p.offload.modules & (kOffloadAttnNorm | kOffloadMlpNorm))
      return fail(r, "offload modules attn_norm and mlp_norm cannot be offloaded under CUDA graphs (valid with graphs: "
                     "qkv_linear, core_attn, attn_proj, expert_fc1, moe_act)");
    if (g.modules && (!(g.modules & kGraphAttn) || (moe && !(g.modules & kGraphMoeRouter))))
      return fail(r, "cuda_graphs.modules " + module_text(g.modules, graph_module_names()) +
                         " with offload.modules must capture attn and moe_router (Megatron-LM's fine-grained offloading "
                         "under CUDA graphs)");
  }
  return std::nullopt;
}

}  // namespace

std::optional<RuleViolation> check_plan_sizes(const Plan& p) {
  const Parallel& q = p.parallel;
  const std::pair<const char*, long> positives[] = {
      {"gpus", p.gpus}, {"seq_len", static_cast<long>(p.seq_len)}, {"micro_batch", p.micro_batch},
      {"tp", q.tp}, {"pp", q.pp}, {"vpp", q.vpp}, {"cp", q.cp}, {"ep", q.ep}, {"etp", q.etp}};
  for (const auto& [name, v] : positives)
    if (v < 1) return fail(Rule::Positive, std::string(name) + " = " + std::to_string(v) + " must be at least 1");
  if (p.global_batch < 0) return fail(Rule::Positive, "global_batch = " + std::to_string(p.global_batch) + " must be positive (or 0 for the default)");
  if (p.gpus_per_node < 0) return fail(Rule::Positive, "gpus_per_node = " + std::to_string(p.gpus_per_node) + " must be positive");
  if (!p.packed_lengths.empty()) {
    // A packed microbatch is one THD sequence of seq_len tokens made of these segments.
    if (p.micro_batch != 1)
      return fail(Rule::Positive, "micro_batch = " + std::to_string(p.micro_batch) + " with packed_lengths must be 1 (a packed microbatch is one THD sequence)");
    int64_t sum = 0;
    for (int64_t l : p.packed_lengths) {
      if (l < 1 || l > p.seq_len - sum)
        return fail(Rule::Positive, "packed_lengths must be positive and sum to seq_len = " + std::to_string(p.seq_len));
      sum += l;
    }
    if (sum != p.seq_len)
      return fail(Rule::Positive, "packed_lengths sum to " + std::to_string(sum) + ", not seq_len = " + std::to_string(p.seq_len));
  }
  if (!p.packed_splits.empty()) {
    if (p.packed_splits.size() != p.packed_lengths.size())
      return fail(Rule::Positive, "packed_splits has " + std::to_string(p.packed_splits.size()) + " entries, not one per "
                  "packed_lengths entry (" + std::to_string(p.packed_lengths.size()) + ")");
    for (int g : p.packed_splits)
      if (g < 1 || g > p.parallel.cp || p.parallel.cp % g != 0 || (g & (g - 1)) != 0)
        return fail(Rule::Positive, "packed_splits holds " + std::to_string(g) + " (valid: a power of two dividing cp = " +
                    std::to_string(p.parallel.cp) + ")");
  }
  // The time model walks communicator groups rank by rank: a typo like --gpus 100000000 must not hang or exhaust memory.
  constexpr int kMaxGpus = 1 << 20;
  if (p.gpus > kMaxGpus)
    return fail(Rule::Positive, "gpus = " + std::to_string(p.gpus) + " is out of range (valid: 1 to " + std::to_string(kMaxGpus) + ")");
  return std::nullopt;
}

namespace {

// Heads split over tp (attention, KV, linear-attention key/value, MLA) and linear attention's heads over cp.
std::optional<RuleViolation> head_rules(const ModelSpec& m, const Parallel& q) {
  auto heads_rule = [&](long heads, const char* what) -> std::optional<RuleViolation> {
    if (heads > 0 && heads % q.tp != 0)
      return fail(Rule::TpHeads, "tp = " + std::to_string(q.tp) + " does not divide the " + std::to_string(heads) + " " +
                                     what + " (valid tp: " + divisors(heads) + ")");
    return std::nullopt;
  };
  if (has_kind(m, MixerKind::FullAttention)) {
    if (auto v = heads_rule(m.attn.heads, "attention heads")) return v;
    if (auto v = heads_rule(m.attn.kv_heads, "KV heads")) return v;
  }
  if (has_kind(m, MixerKind::LinearAttention)) {
    if (auto v = heads_rule(m.linear.key_heads, "linear-attention key heads")) return v;
    if (auto v = heads_rule(m.linear.value_heads, "linear-attention value heads")) return v;
    const long kh = m.linear.key_heads / q.tp;
    if (kh % q.cp != 0)
      return fail(Rule::CpLinearHeads, "cp = " + std::to_string(q.cp) + " does not divide the " + std::to_string(kh) +
                                           " linear-attention key heads per TP rank (head-parallel CP needs valid cp: " +
                                           divisors(kh) + ")");
  }
  if (has_kind(m, MixerKind::MLA))
    if (auto v = heads_rule(m.mla.heads, "MLA heads")) return v;
  return std::nullopt;
}

// The MoE options: chunk count, routing imbalance and capacity factor in range.
std::optional<RuleViolation> moe_option_rules(const ModelSpec& m, const Plan& p) {
  const bool moe = has_moe(m);
  if (p.moe.ep_chunks < 1 || p.moe.ep_chunks > moe::kMaxChunks)
    return fail(Rule::MoeChunks, "ep_chunks = " + std::to_string(p.moe.ep_chunks) + " is out of range (valid: 1 to " +
                                     std::to_string(moe::kMaxChunks) + ")");
  if (!moe && p.moe.ep_chunks > 1)
    return fail(Rule::MoeChunks, "ep_chunks = " + std::to_string(p.moe.ep_chunks) + " needs a MoE model (use 1)");
  const double tokens_per_rank = hidden_tokens(p);  // tokens each rank routes (estimator/derived_plan.h)
  if (p.moe.ep_chunks > tokens_per_rank)
    return fail(Rule::MoeChunks, "ep_chunks = " + std::to_string(p.moe.ep_chunks) + " exceeds the " +
                                     std::to_string(static_cast<long>(tokens_per_rank)) + " tokens each rank routes");
  if (!(p.moe.routing_imbalance >= 1.0) || p.moe.routing_imbalance > 64)
    return fail(Rule::MoeRouting, "routing_imbalance = " + std::to_string(p.moe.routing_imbalance) + " is out of range (valid: 1 to 64; 1 = balanced)");
  if (!(p.moe.capacity_factor >= 0) || p.moe.capacity_factor > 64)
    return fail(Rule::MoeRouting, "capacity_factor = " + std::to_string(p.moe.capacity_factor) + " is out of range (valid: 0 = dropless, or up to 64)");
  if (!(p.moe.rank_capacity_factor >= 0) || p.moe.rank_capacity_factor > 64)
    return fail(Rule::MoeRouting, "rank_capacity_factor = " + std::to_string(p.moe.rank_capacity_factor) +
                                      " is out of range (valid: 0 = no per-rank budget, or up to 64)");
  if (p.moe.rank_capacity_factor > 0 && (!moe || p.moe.dispatcher != MoeDispatcher::HybridEP))
    return fail(Rule::MoeRouting, std::string("rank_capacity_factor is HybridEP's per-rank budget, but the plan's ") +
                                      (moe ? "dispatcher is " + std::string(to_string(p.moe.dispatcher)) : "model has no MoE layers") +
                                      " (valid: dispatcher hybridep, or rank_capacity_factor 0)");
  if (p.moe.paged_stash && !(p.moe.rank_capacity_factor > 0))
    return fail(Rule::MoeRouting, "paged_stash needs HybridEP's rank_capacity_factor (Megatron pairs --moe-paged-stash with "
                                  "--moe-expert-rank-capacity-factor; give one or turn paged_stash off)");
  return std::nullopt;
}

// Megatron-LM's cross-microbatch EP overlap: where its schedule exists and what it cannot pair with.
std::optional<RuleViolation> a2a_overlap_rules(const ModelSpec& m, const Plan& p) {
  const Parallel& q = p.parallel;
  const bool moe = has_moe(m);
  if (p.moe.a2a_overlap && (!moe || q.ep == 1))
    return fail(Rule::A2aOverlap, "moe.a2a_overlap needs a MoE model with ep > 1 (there is no expert all-to-all to overlap)");
  // Megatron-LM overlaps one microbatch's all-to-all with another's compute only in the combined 1F1B schedule,
  // which needs pp = 1 or a virtual pipeline (megatron/training/arguments.py, --overlap-moe-expert-parallel-comm).
  if (p.moe.a2a_overlap && q.pp > 1 && q.vpp == 1)
    return fail(Rule::A2aOverlap, "moe.a2a_overlap needs pp = 1 or vpp > 1 (Megatron's combined 1F1B schedule); pp = " +
                                      std::to_string(q.pp) + " with vpp = 1");
  // Its merged forward/backward cannot pair a recomputed forward, nor run without the MoE layer's activations
  // (Megatron-Bridge comm_overlap.py: no full recompute, no moe recompute).
  if (p.moe.a2a_overlap && p.recompute == Recompute::Full)
    return fail(Rule::A2aOverlap, "moe.a2a_overlap contradicts recompute = full (Megatron's EP overlap cannot pair a "
                                  "recomputed forward with another microbatch's backward; use selective recompute or no overlap)");
  if (p.moe.a2a_overlap && p.recompute == Recompute::Selective && (p.recompute_modules & kRecomputeMoe))
    return fail(Rule::A2aOverlap, "moe.a2a_overlap contradicts recompute module moe (Megatron's EP overlap needs the MoE "
                                  "layer's activations; drop moe from recompute_modules)");
  return std::nullopt;
}

}  // namespace

std::optional<RuleViolation> check_plan(const ModelSpec& m, const Plan& p) {
  const Parallel& q = p.parallel;
  if (auto v = check_plan_sizes(p)) return v;

  // Model-structure rules first: their sentences say more than a divisibility of the GPU count.
  if (auto v = head_rules(m, q)) return v;

  // Divisibility step by step: the product tp*pp*cp of unchecked input can overflow even 64 bits.
  if (p.gpus % q.tp != 0 || (p.gpus / q.tp) % q.pp != 0 || (p.gpus / q.tp / q.pp) % q.cp != 0) {
    const double model_par = double(q.tp) * q.pp * q.cp;
    char prod[64];
    std::snprintf(prod, sizeof prod, "%.0f", model_par);
    return fail(Rule::GpusDivisible, "gpus = " + std::to_string(p.gpus) + " is not divisible by tp*pp*cp = " + prod);
  }
  const long model_par = static_cast<long>(q.tp) * q.pp * q.cp;
  const int dp = static_cast<int>(p.gpus / model_par);

  const bool moe = has_moe(m);
  if (!moe && q.ep > 1) return fail(Rule::EpExperts, "ep = " + std::to_string(q.ep) + " needs a MoE model (" + m.name + " is dense: use ep = 1)");
  if (!moe && q.etp > 1) return fail(Rule::EpExperts, "etp = " + std::to_string(q.etp) + " needs a MoE model (" + m.name + " is dense: use etp = 1)");
  if (moe && m.moe.num_experts % q.ep != 0)
    return fail(Rule::EpExperts, "ep = " + std::to_string(q.ep) + " does not divide the " + std::to_string(m.moe.num_experts) +
                                     " experts (valid ep: " + divisors(m.moe.num_experts, p.gpus) + ")");
  const long stage_ranks = static_cast<long>(q.tp) * q.cp * dp;
  if (stage_ranks % (static_cast<long>(q.ep) * q.etp) != 0)
    return fail(Rule::ExpertGroup, "ep*etp = " + std::to_string(static_cast<long>(q.ep) * q.etp) + " does not divide the " +
                                       std::to_string(stage_ranks) + " ranks of a pipeline stage (tp*cp*dp)");
  if (moe && m.moe.expert_ffn % q.etp != 0)
    return fail(Rule::EtpFfn, "etp = " + std::to_string(q.etp) + " does not divide the expert ffn size " + std::to_string(m.moe.expert_ffn));

  if (q.vpp > 1 && q.pp == 1) return fail(Rule::VppNeedsPp, "vpp = " + std::to_string(q.vpp) + " needs pp > 1 (use vpp = 1 with pp = 1)");
  const SplitResult split = split_layers(int(m.layers.size()), q.pp, q.vpp, p.pipeline);
  if (!split.ok) return fail(Rule::LayersSplit, split.error);

  const long need = q.cp > 1 ? 2L * q.cp * q.tp : (p.sequence_parallel && q.tp > 1 ? q.tp : 1);
  for (int64_t l : p.packed_lengths)
    if (l % need != 0)
      return fail(Rule::SeqDivisible, "packed length " + std::to_string(l) + " is not divisible by " +
                                          (q.cp > 1 ? "2*cp*tp = " : "tp = ") + std::to_string(need) +
                                          " (each packed sequence is padded to it, as THD attention with CP needs)");
  if (p.seq_len % need != 0)
    return fail(Rule::SeqDivisible, "seq_len = " + std::to_string(p.seq_len) + " is not divisible by " +
                                        (q.cp > 1 ? "2*cp*tp = " : "tp = ") + std::to_string(need) +
                                        (q.cp > 1 ? " (load-balanced causal CP splits each sequence into 2*cp chunks)" : " (sequence parallel)"));

  const int gb = effective_global_batch(p);
  if (gb % (static_cast<long>(p.micro_batch) * dp) != 0)
    return fail(Rule::BatchDivisible, "global_batch = " + std::to_string(gb) + " is not divisible by micro_batch*dp = " +
                                          std::to_string(static_cast<long>(p.micro_batch) * dp));
  // A group smaller than pp stalls the interleaved schedule: a chunk's next microbatch waits on the whole pipeline.
  if (p.microbatch_group != 0 && q.vpp == 1)
    return fail(Rule::VppNeedsPp, "pipeline.microbatch_group = " + std::to_string(p.microbatch_group) +
                                      " orders an interleaved schedule, but vpp = 1 (valid: 0, or vpp > 1)");
  const int step_microbatches = std::max(q.pp, num_microbatches(p));
  if (p.microbatch_group != 0 && (p.microbatch_group < q.pp || (!p.batches && p.microbatch_group > step_microbatches)))
    return fail(Rule::VppNeedsPp, "pipeline.microbatch_group = " + std::to_string(p.microbatch_group) +
                                      " is out of range (valid: 0 for pp, or pp = " + std::to_string(q.pp) +
                                      " up to the step's " + std::to_string(step_microbatches) + " microbatches)");

  if (auto v = moe_option_rules(m, p)) return v;

  const long per_chunk = split.split.max_chunk_layers();
  if (p.recompute_layers < 0 || p.recompute_layers > per_chunk)
    return fail(Rule::RecomputeLayers, "recompute_layers = " + std::to_string(p.recompute_layers) +
                                           " is out of range (valid: 0 = all, up to the " + std::to_string(per_chunk) +
                                           " layers of a virtual stage)");
  if (auto v = a2a_overlap_rules(m, p)) return v;
  if (p.recompute_layers > 0 && p.recompute != Recompute::Full)
    return fail(Rule::RecomputeLayers, "recompute_layers = " + std::to_string(p.recompute_layers) + " needs recompute = full");
  // Megatron-LM arguments.py: distributed checkpoints need tp > 1 and full recompute, and exclude sequence parallelism.
  if (p.distribute_saved_activations && (q.tp == 1 || p.recompute != Recompute::Full || p.sequence_parallel))
    return fail(Rule::RecomputeLayers, std::string("distribute_saved_activations splits full recompute's checkpoints over "
                                                   "the TP ranks, so it needs tp > 1, recompute = full and "
                                                   "sequence_parallel = false; the plan has tp = ") +
                                           std::to_string(q.tp) + ", recompute = " + to_string(p.recompute) +
                                           ", sequence_parallel = " + (p.sequence_parallel ? "true" : "false"));
  if (auto v = run_settings_rule(m, p)) return v;
  return cuda_graph_rule(m, p);
}

void require_valid_plan(const ModelSpec& m, const Plan& p) {
  if (auto v = check_plan(m, p)) throw UserError(v->message);
}

}  // namespace lcplan
