#include "estimator/derived_plan.h"

#include <algorithm>
#include <cmath>

namespace lcplan {

double local_tokens(const Plan& p) { return double(p.seq_len) * p.micro_batch / p.parallel.cp; }

double hidden_tokens(const Plan& p) {
  const double s = local_tokens(p);
  return p.sequence_parallel && p.parallel.tp > 1 ? s / p.parallel.tp : s;
}

double routed_load_factor(const Plan& p) {
  // HybridEP drops what a rank receives beyond its budget (megatron-settings.md, moe_expert_rank_capacity_factor).
  const double budget = p.moe.rank_capacity_factor > 0 ? p.moe.rank_capacity_factor : HUGE_VAL;
  if (p.moe.capacity_factor <= 0) return std::min(p.moe.routing_imbalance, budget);
  // Megatron pads every expert to capacity = ceil(tokens / experts x cf) with --moe-pad-expert-input-to-capacity;
  // without it the busiest rank keeps its tokens up to that capacity (moe_utils.py get_capacity).
  return std::min(budget, p.moe.pad_to_capacity ? p.moe.capacity_factor
                                                : std::min(p.moe.capacity_factor, p.moe.routing_imbalance));
}

bool static_moe_shapes(const Plan& p) {
  return (p.moe.capacity_factor > 0 && p.moe.pad_to_capacity) ||
         (p.moe.dispatcher == MoeDispatcher::HybridEP && p.moe.rank_capacity_factor > 0 && p.moe.paged_stash);
}

namespace {

constexpr double kBf16 = 2;  // bytes of a bf16 element
constexpr double kFp32 = 4;  // bytes of an fp32 element

// Saved-tensor accounting in bf16, one tensor at a time (after Korthikanti et al. 2022, arXiv 2205.05198,
// section 4, with flash attention so no s^2 term). Each tensor names the recompute modules that drop it (Megatron
// --recompute-modules, transformer_config.py) and the offload module whose input it is (--offload-modules: that
// module's input goes to the host, fine_grained_activation_offloading.md).
struct Acc {
  uint16_t drop = 0;     // the plan's selective recompute modules (0 unless selective)
  uint16_t offload = 0;  // the plan's offloaded modules
  double offload_share = 1;  // the share of an offloaded module's input that goes (offload.modules_fraction)
  double total = 0, dropped = 0, offloaded = 0, moe = 0;
  void add(double bytes, uint16_t recompute = 0, uint16_t offload_as = 0) {
    total += bytes;
    if (recompute & drop) dropped += bytes;
    else if (offload_as & offload) offloaded += offload_share * bytes;
  }
};

struct TokenShape {
  double local;   // tokens of this rank's CP shard (GEMM M after the SP all-gather)
  double hidden;  // tokens of hidden-sized tensors on this rank
  double tp;
  double in;      // bytes per element of a GEMM input saved for the weight gradient (low precision saves it quantized)
  double qkv;     // bytes per element of flash attention's saved q, k, v (fp8 attention keeps them in fp8)
  double router;  // bytes per element of the router's logits and probabilities (--moe-router-dtype)
  double expert_out;  // bytes per element of the routed experts' output kept for the routing weights' gradient
  double flash_out;   // bytes per element of flash attention's own output beside o_proj's copy (0: one tensor)
  bool norm_input;    // the pre-FFN norm's input is kept beside its output (else the output is rebuilt from it)
  RecomputeScope scope;
};

// A low-precision recipe saves each GEMM's input in the GEMM's format for the weight gradient (Transformer Engine
// keeps the quantized copy): fp8 1 byte (blockwise: plus an fp32 scale per 128-element tile, TE Float8BlockQuantizer);
// mxfp8 1 byte + one 8-bit scale per 32 elements; nvfp4 half a byte + one 8-bit scale per 16 (OCP Microscaling spec
// v1.0; NVIDIA NVFP4 format description, arXiv 2509.25149).
}  // namespace

double gemm_input_bytes(Precision p, Fp8Recipe recipe) {
  switch (p) {
    case Precision::BF16: return kBf16;
    case Precision::FP8: return recipe == Fp8Recipe::Blockwise ? 1.0 + 4.0 / 128 : 1.0;
    case Precision::MXFP8: return 1.0 + 1.0 / 32;
    case Precision::NVFP4: return 0.5 + 1.0 / 16;
  }
  return kBf16;
}

namespace {

void mixer_acts(const ModelSpec& m, const LayerSpec& l, const TokenShape& s, Acc& a) {
  const double h = m.hidden;
  // pre-mixer norm output (projection input, re-gathered under SP)
  a.add(s.in * s.hidden * h, s.scope.mixer_norm ? kRecomputeLayernorm : 0, kOffloadQkvLinear);
  switch (l.mixer) {
    case MixerKind::FullAttention: {
      const AttentionSpec& at = m.attn;
      const double q = at.heads / s.tp * at.head_dim, kv = at.kv_heads / s.tp * at.head_dim;
      a.add(s.qkv * s.local * (q + 2 * kv), 0, kOffloadCoreAttn);  // q, k, v (flash attention inputs)
      if (at.output_gate) {
        a.add(kBf16 * s.local * q);                         // attention output before the gate
        a.add((kBf16 + s.in) * s.local * q, 0, kOffloadAttnProj);  // gate and gated output (o_proj input)
      } else {
        a.add(s.in * s.local * q, 0, kOffloadAttnProj);     // attention output (o_proj input)
        a.add(s.flash_out * s.local * q, kRecomputeCoreAttn);  // flash attention's own output (its backward reads it)
      }
      a.add(kFp32 * s.local * at.heads / s.tp, kRecomputeCoreAttn);  // softmax log-sum-exp
      break;
    }
    case MixerKind::LinearAttention: {
      const LinearAttentionSpec& g = m.linear;
      const double k = g.key_heads / s.tp * g.key_head_dim, v = g.value_heads / s.tp * g.value_head_dim;
      const double vh = g.value_heads / s.tp;
      a.add(kBf16 * s.local * (2 * k + 2 * v + 2 * vh));  // in_proj outputs q, k, v, z, b, a
      a.add(kBf16 * s.local * (2 * k + v));               // conv1d + SiLU outputs (delta-rule inputs)
      a.add(kFp32 * s.local * 2 * vh);                    // decay g and beta in fp32
      a.add((kBf16 + s.in) * s.local * v);                // delta-rule output and gated-norm output (out_proj input)
      break;
    }
    case MixerKind::MLA: {
      const MlaSpec& ml = m.mla;
      const double heads = ml.heads / s.tp, qk = double(ml.qk_nope_head_dim) + ml.qk_rope_head_dim;
      // The down-projections run on the sequence-parallel rows (Megatron-LM multi_latent_attention.py: duplicated over
      // TP, the up-projections gather): q_a output and its norm (q_b input), kv_a output and its norm (kv_b input).
      if (ml.q_lora_rank > 0) a.add((kBf16 + s.in) * s.hidden * ml.q_lora_rank);
      a.add(kBf16 * s.hidden * (ml.kv_lora_rank + ml.qk_rope_head_dim) + s.in * s.hidden * ml.kv_lora_rank);
      // q, k, v after the up-projections and RoPE (what mla_up_proj discards and rebuilds)
      a.add(s.qkv * s.local * heads * (2 * qk + ml.v_head_dim), kRecomputeMlaUpProj, kOffloadCoreAttn);
      a.add(s.in * s.local * heads * ml.v_head_dim, 0, kOffloadAttnProj);  // attention output (o_proj input)
      a.add(s.flash_out * s.local * heads * ml.v_head_dim, kRecomputeCoreAttn);  // flash attention's own output
      a.add(kFp32 * s.local * heads, kRecomputeCoreAttn);                   // log-sum-exp
      break;
    }
  }
}

// Gated MLP on `tokens` tokens with `ffn` columns on this rank: fc1 output (gate+up) and activation output (fc2 input).
// `whole`: the recompute modules that drop the whole MLP; the activation is also dropped by moe_act (lcplan applies it
// to every MLP, as its selective set always did); `fc1_out`: the offload module whose input the fc1 output is.
void mlp_acts(const ModelSpec& m, const TokenShape& s, double tokens, double ffn, Acc& a, bool moe_part, uint16_t whole,
              uint16_t fc1_out) {
  const double up = m.gated_mlp ? 2 : 1;
  const double fc1 = kBf16 * tokens * up * ffn, act = s.in * tokens * ffn;
  a.add(fc1, whole, fc1_out);
  a.add(act, whole | (moe_part || s.scope.other_mlp_act ? kRecomputeMoeAct : 0));
  if (moe_part) a.moe += fc1 + act;
}

void ffn_acts(const ModelSpec& m, const Plan& p, const LayerSpec& l, const TokenShape& s, double routed, Acc& a) {
  const double h = m.hidden;
  // A norm fused into a dense fc1 is part of the MLP that mlp recompute checkpoints from the norm's input.
  const uint16_t norm = s.scope.ffn_norm ? kRecomputeLayernorm : l.ffn == FfnKind::Dense ? kRecomputeMlp : 0;
  // pre-FFN norm output: fc1's input, or the router's, which keeps it in bf16 (the router GEMM is not low precision),
  // beside the shared experts' fc1 copy in the GEMMs' format
  const bool moe = l.ffn == FfnKind::MoE;
  a.add((moe ? kBf16 : s.in) * s.hidden * h, norm);
  if (moe && m.moe.shared_experts > 0 && s.in != kBf16) a.add(s.in * s.hidden * h, norm);
  if (!moe) {
    mlp_acts(m, s, s.local, m.dense_ffn / s.tp, a, false, kRecomputeMlp, 0);
    return;
  }
  const MoeSpec& e = m.moe;
  a.add(2 * s.router * s.hidden * e.num_experts, kRecomputeMoe);  // router logits and probabilities
  const double w = routed_width(m);
  a.add(s.in * routed * w, kRecomputeMoe, kOffloadExpertFc1);     // dispatched tokens (fc1 input)
  a.add(s.expert_out * routed * w, kRecomputeMoe);  // expert output before a weighted combine (the weights' gradient)
  a.moe += (s.in + s.expert_out) * routed * w;
  if (e.latent > 0) a.add(s.in * s.hidden * e.latent, kRecomputeMoe);  // the combined latent tokens (up-projection input)
  mlp_acts(m, s, routed, double(e.expert_ffn) / p.parallel.etp, a, true, kRecomputeMoe, kOffloadMoeAct);
  if (e.shared_experts > 0)
    mlp_acts(m, s, s.local, double(e.shared_experts) * e.shared_ffn / s.tp, a, false, kRecomputeMoe | kRecomputeSharedExperts, 0);
}

double routed_token_copies(const ModelSpec& m, const Plan& p) {
  return hidden_tokens(p) * p.parallel.etp * m.moe.top_k * routed_load_factor(p);
}

// Microbatches whose activations virtual chunk j of stage r holds at the stage's peak (1F1B): no VPP, pp - r
// (Korthikanti et al. 2022 section 4.2.3). VPP: what Megatron's interleaved schedule holds at the start of stage r's
// first backward, its 2 (pp-r-1) + (vpp-1) g warmup forwards plus one, taken in its table's order: groups of g
// microbatches (--microbatch-group-size-per-virtual-pipeline-stage, default pp) run chunk 0, then chunk 1, ...
// (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, get_schedule_table; executor/schedule.h
// checks it). With g = pp it is Megatron-Bridge's memory estimator's count (https://github.com/ISEEKYAN/mbridge,
// memory_estimator/estimate_013.py).
double inflight(int r, int j, int pp, int vpp, int microbatches, int group) {
  const long m = std::max(microbatches, 1);
  if (vpp == 1) return double(std::min<long>(pp - r, m));
  const long g = group > 0 ? group : pp;
  long left = std::min<long>(2L * (pp - r - 1) + long(vpp - 1) * g + 1, m * vpp);  // forwards done
  long held = 0;
  for (long g0 = 0; left > 0 && g0 < m; g0 += g) {
    const long size = std::min(g, m - g0);  // the last group takes what is left
    held += std::clamp(left - j * size, 0L, size);
    left -= vpp * size;
  }
  return double(held);
}

UnitParams unit_params(const LayerParams& lp, const Parallel& q) {
  return {(lp.mixer + lp.dense_mlp + lp.shared_experts) / q.tp + lp.mixer_replicated + lp.router + lp.latent_proj + lp.norms,
          lp.routed_experts / (double(q.ep) * q.etp)};
}

void add_unit(StageRecord& st, const UnitParams& u) {
  st.params.dense += u.dense;
  st.params.expert += u.expert;
  st.max_unit = std::max(st.max_unit, u.dense + u.expert);
}

GroupFacts group_facts(const RankLayout& l, Group g, int gpus_per_node) {
  GroupFacts f;
  f.size = group_size(l, g);
  f.nodes = group_nodes(l, g, gpus_per_node);
  f.tier = f.nodes == 1 ? LinkTier::NVLink : LinkTier::Network;
  return f;
}

bool same_kind(const LayerSpec& a, const LayerSpec& b) {
  return a.mixer == b.mixer && a.ffn == b.ffn && a.sliding == b.sliding;
}

// The index of `l`'s kind in d.kinds, added on first sight (its FLOPs and traffic from `like` when it has the kind:
// they read only the model and the sequence length).
int kind_index(DerivedPlan& d, const ModelSpec& m, const Plan& p, const LayerSpec& l, const DerivedPlan* like) {
  for (size_t k = 0; k < d.kinds.size(); ++k)
    if (same_kind(d.kinds[k].spec, l)) return int(k);
  LayerKind k;
  k.spec = l;
  const LayerKind* known = nullptr;
  for (size_t i = 0; like && !known && i < like->kinds.size(); ++i)
    if (same_kind(like->kinds[i].spec, l)) known = &like->kinds[i];
  k.flops = known ? known->flops : layer_forward_flops(m, l, d.seq, 0, p.packed_lengths);
  k.traffic = known ? known->traffic : layer_traffic(m, l);
  k.params = unit_params(layer_params(m, l), p.parallel);
  // when_kept and when_recomputed depend on the recompute choice: derive_options
  d.kinds.push_back(k);
  return int(d.kinds.size() - 1);
}

// Stage r runs the same layer records as stage s (virtual stage by virtual stage) with the same parameters.
bool same_stage(const DerivedPlan& d, const std::vector<int>& chunk_start, int r, int s) {
  const StageRecord &a = d.stages[r], &b = d.stages[s];
  if (a.layers != b.layers || a.params.dense != b.params.dense || a.params.expert != b.params.expert ||
      a.max_unit != b.max_unit || a.has_moe != b.has_moe)
    return false;
  for (int cr = r, cs = s; cr < d.split.chunks(); cr += d.split.pp, cs += d.split.pp) {
    if (d.split.layers[cr] != d.split.layers[cs]) return false;
    for (int i = 0; i < d.split.layers[cr]; ++i)
      if (d.layers[chunk_start[cr] + i].kind != d.layers[chunk_start[cs] + i].kind) return false;
  }
  return true;
}

void mark_same_stages(DerivedPlan& d) {
  std::vector<int> chunk_start(d.split.chunks() + 1, 0);
  for (int c = 0; c < d.split.chunks(); ++c) chunk_start[c + 1] = chunk_start[c] + d.split.layers[c];
  const int pp = int(d.stages.size());
  for (int r = 0; r < pp; ++r) {
    d.stages[r].same_as = r;
    for (int s = 0; s < r && r + 1 < pp; ++s)
      if (d.stages[s].same_as == s && same_stage(d, chunk_start, r, s)) {
        d.stages[r].same_as = s;
        break;
      }
  }
}

}  // namespace

int nvlink_domain_gpus(const Plan& p, const Hardware& hw) { return p.gpus_per_node > 0 ? p.gpus_per_node : hw.gpus_per_node; }

namespace {

TokenShape token_shape(const Plan& p, const LayerSpec& layer) {
  const bool fp8_attention = p.fp8.attention && p.precision != Precision::BF16;
  // Weights applied in the activation are backpropagated through the saved fc1 output; a weighted combine keeps the
  // expert output.
  const Framework* fw = find_framework(p.implementation);
  const double expert_out = fw && fw->can.probs_in_activation ? 0.0 : kBf16;
  // Flash attention's backward reads its bf16 output; o_proj keeps its own low-precision copy as its input.
  const double in = gemm_input_bytes(p.precision, p.fp8.recipe);
  const double flash_out = !fp8_attention && in != kBf16 ? kBf16 : 0.0;
  return {local_tokens(p), hidden_tokens(p), double(p.parallel.tp), in, fp8_attention ? 1.0 : kBf16,
          dtype_bytes(p.moe.router_dtype), expert_out, flash_out, !fw || fw->can.keeps_norm_input,
          recompute_scope(p, layer)};
}

}  // namespace

RecomputeScope recompute_scope(const Plan& p, const LayerSpec& layer) {
  RecomputeScope r;
  const Framework* fw = find_framework(p.implementation);
  if (fw && fw->can.fused_norm_linears) {
    r.mixer_norm = layer.mixer == MixerKind::MLA;
    r.ffn_norm = layer.ffn == FfnKind::MoE;
  }
  if (fw && fw->can.moe_act_experts_only) r.other_mlp_act = false;
  return r;
}

LayerActivation ffn_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer) {
  Acc a;
  a.drop = p.recompute == Recompute::Selective ? p.recompute_modules : 0;
  ffn_acts(m, p, layer, token_shape(p, layer), routed_token_copies(m, p), a);
  return {a.total - a.dropped, a.total, a.moe, 0};
}

LayerActivation layer_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer, bool recomputed) {
  const TokenShape s = token_shape(p, layer);
  Acc a;
  a.drop = p.recompute == Recompute::Selective ? p.recompute_modules : 0;
  a.offload = recomputed ? 0 : p.offload.modules;
  a.offload_share = p.offload.modules_fraction;
  a.add(kBf16 * s.hidden * m.hidden, 0, kOffloadAttnNorm);  // layer input: the residual stream (all full recompute keeps)
  const double input = a.total;
  mixer_acts(m, layer, s, a);
  // The residual after the mixer, the pre-FFN norm's input: its backward reads it (Korthikanti et al. 2022 section 4:
  // each norm keeps its input), and layernorm recompute keeps it to rebuild the output.
  if (s.norm_input) a.add(kBf16 * s.hidden * m.hidden, 0, kOffloadMlpNorm);
  ffn_acts(m, p, layer, s, routed_token_copies(m, p), a);
  LayerActivation out;
  out.full = a.total;
  out.moe_tokens = a.moe;
  out.offloaded = a.offloaded;
  // Full recompute keeps the layer input; the uniform method keeps one per checkpoint of recompute_layers layers;
  // distributed checkpoints keep a 1/tp slice of it (Plan::distribute_saved_activations).
  const double group = layers_per_checkpoint(p);
  const double split = p.distribute_saved_activations ? p.parallel.tp : 1;
  if (recomputed) out.saved = input / group / split;
  else out.saved = a.total - a.dropped - a.offloaded;
  return out;
}

namespace {

// The local sequence flash attention runs at and the tokens whose K/V CP exchanges: each sequence's local share (a
// micro batch of b sequences runs b sequences of seq / cp, as FlashAttention-3's benchmarks hold batch x seq fixed
// while the rate rises with seq: attention_half_seq is per sequence); packed, the sequences' own lengths; under hybrid
// CP (Plan::packed_splits), each sequence's chunk on the ranks it is split over.
void set_attention_view(DerivedPlan& d, const Plan& p) {
  const Parallel& q = p.parallel;
  d.attention_seq = d.seq / q.cp;
  d.packed = !p.packed_lengths.empty();
  if (d.packed) {
    // Varlen flash attention runs each sequence on its own: its length weighted by the FLOPs it carries (L_i^2).
    double squares = 0;
    for (int64_t l : p.packed_lengths) squares += double(l) * double(l);
    d.attention_seq = squares / d.seq / q.cp;
  }
  // A load-balanced K/V ring of r ranks (p2p, or a2a+p2p's ring across a2a groups) runs its own chunks' attention
  // under the causal mask and the r - 1 received ones without a mask, 1/r of the FLOPs each (TransformerEngine
  // attention.py AttnFuncWithCPAndKVP2P); a2a and all_gather run causal kernels over what they gather.
  const double a2a = p.comm.cp == CpComm::A2AP2P ? std::max(1, p.comm.cp_a2a_size) : 1;
  const bool ring = p.comm.cp == CpComm::P2P || p.comm.cp == CpComm::A2AP2P;
  auto causal_over = [&](double ranks) { return ring ? std::min(1.0, a2a / ranks) : 1.0; };  // split over `ranks`
  d.causal_share = causal_over(q.cp);
  d.cp_split_tokens = d.local_tokens;
  if (!p.packed_splits.empty()) {
    // Hybrid CP: a sequence split over g ranks runs chunks of L / g; its entries stand for g / cp of the rank's work.
    double chunk_squares = 0, tokens = 0, split = 0, causal_work = 0;
    for (size_t i = 0; i < p.packed_lengths.size(); ++i) {
      const double l = double(p.packed_lengths[i]), g = p.packed_splits[i];
      chunk_squares += l * l / g, tokens += l;
      if (g > 1) split += l;
      if (g > 1) d.split_ring_tokens[std::min<size_t>(16, size_t(std::log2(g) + 0.5))] += l / q.cp;
      causal_work += l * l / g * causal_over(g);
    }
    d.causal_share = chunk_squares > 0 ? causal_work / chunk_squares : 1.0;
    d.attention_seq = chunk_squares / tokens;
    d.cp_split_tokens = d.local_tokens * split / tokens;
  }
}

}  // namespace

DerivedPlan derive_plan(const ModelSpec& m, const Plan& p, const Hardware& hw) {
  DerivedPlan d = derive_layout(m, p, hw);
  derive_options(d);
  return d;
}

DerivedPlan derive_layout(const ModelSpec& m, const Plan& p, const Hardware& hw, const DerivedPlan* like) {
  // `like` serves only when it derives the same model and sequence length.
  // A packed microbatch's FLOPs read its lengths too: it lends and borrows nothing.
  if (like && (like->model != &m || like->seq != double(p.seq_len) || like->packed || !p.packed_lengths.empty()))
    like = nullptr;
  const Parallel& q = p.parallel;
  DerivedPlan d;
  d.model = &m;
  d.plan = &p;
  d.switches = effective_switches(p);
  d.dp = data_parallel(p);
  d.edp = int(int64_t(q.tp) * q.cp * d.dp / (int64_t(q.ep) * q.etp));
  d.global_batch = effective_global_batch(p);
  d.microbatches = std::max(1, num_microbatches(p));
  d.seq = double(p.seq_len);
  d.local_tokens = local_tokens(p);
  d.hidden_tokens = hidden_tokens(p);
  d.sequence_share = double(p.micro_batch) / q.cp;
  set_attention_view(d, p);
  d.sequence_parallel = p.sequence_parallel && q.tp > 1;
  d.has_moe = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
  if (d.has_moe) {
    d.routed_tokens = routed_token_copies(m, p);
    d.tokens_per_local_expert = d.routed_tokens * q.ep / std::max(1, m.moe.num_experts);
  }

  d.gpus_per_node = nvlink_domain_gpus(p, hw);
  d.layout = make_rank_layout(p.gpus, q.tp, q.pp, q.cp, q.ep, q.etp);
  d.tp = group_facts(d.layout, Group::TP, d.gpus_per_node);
  d.cp = group_facts(d.layout, Group::CP, d.gpus_per_node);
  d.ep = group_facts(d.layout, Group::EP, d.gpus_per_node);
  d.pp = group_facts(d.layout, Group::PP, d.gpus_per_node);
  d.dp_cp = group_facts(d.layout, Group::DP_CP, d.gpus_per_node);
  d.edp_group = group_facts(d.layout, Group::EDP, d.gpus_per_node);
  // Megatron builds each instance from consecutive DP ranks (parallel_state.py intra_distributed_optimizer_instance
  // groups): an instance spans its share of the DP group's nodes, and the ranks across instances sit on as many nodes.
  const auto split_group = [&](const GroupFacts& g, GroupFacts& shard, GroupFacts& across) {
    const int n = std::max(1, p.optimizer.instances);
    shard = g, across = GroupFacts{};
    if (n == 1 || g.size % n != 0) return;
    shard.size = g.size / n;
    shard.nodes = std::max(1, (g.nodes + n - 1) / n);
    shard.tier = shard.nodes == 1 ? LinkTier::NVLink : LinkTier::Network;
    across.size = n;
    across.nodes = std::min(n, g.nodes);
    across.tier = across.nodes == 1 ? LinkTier::NVLink : LinkTier::Network;
  };
  split_group(d.dp_cp, d.dp_shard, d.dp_instances);
  split_group(d.edp_group, d.edp_shard, d.edp_instances);
  d.communicators =
      (q.tp > 1) + (q.cp > 1) + (d.dp * q.cp > 1) + (q.pp > 1) + (q.ep > 1) + (q.etp > 1) + (d.edp > 1) +
      (d.dp_instances.size > 1) + (d.edp_instances.size > 1);

  SplitResult split = split_layers(int(m.layers.size()), q.pp, q.vpp, p.pipeline);
  if (!split.ok) throw std::logic_error("derive_plan on an invalid plan: " + split.error);
  d.split = std::move(split.split);

  // Model FLOPs read the model, the sequence length and the global batch.
  d.model_flops_per_step = like && like->global_batch == d.global_batch ? like->model_flops_per_step
                                                                        : model_flops_per_step(m, p);
  d.stages.assign(q.pp, StageRecord{});
  d.layers.reserve(m.layers.size() + m.mtp_layers);
  for (int c = 0, i = 0; c < d.split.chunks(); ++c)  // virtual stage c runs on stage c % pp as chunk c / pp
    for (int pos = 0; pos < d.split.layers_in(c); ++pos, ++i) {
      LayerRecord r;
      r.kind = kind_index(d, m, p, m.layers[i], like);
      r.stage = c % q.pp;
      r.vchunk = c / q.pp;
      r.pos = pos;
      r.inflight = inflight(r.stage, r.vchunk, q.pp, q.vpp, d.microbatches, microbatch_group_size(p));
      d.layers.push_back(r);
      StageRecord& st = d.stages[r.stage];
      add_unit(st, d.kinds[r.kind].params);
      st.layers++;
      st.inflight_sum += r.inflight;
      st.has_moe = st.has_moe || m.layers[i].ffn == FfnKind::MoE;
    }

  // Embedding on the first stage; LM head, final norm and MTP modules on the last (Megatron's placement).
  const double table = double(m.vocab) * m.hidden / q.tp;  // vocab-parallel embedding / LM head
  add_unit(d.stages.front(), {table, 0});
  StageRecord& last = d.stages.back();
  // Untied models have an LM head; tied ones keep a copy of the embedding on the last stage when pp > 1 (Megatron).
  if (!m.tied_embeddings || q.pp > 1) add_unit(last, {table, 0});
  last.params.dense += m.hidden;  // final norm
  if (m.mtp_layers > 0 && !m.layers.empty()) {
    // Each MTP module: a decoder layer shaped like the last (never sliding), run on the last stage for the one
    // microbatch in flight there (DeepSeek-V3 report, arXiv 2412.19437, section 2.2).
    LayerSpec spec = m.layers.back();
    spec.sliding = false;
    const UnitParams module = unit_params(mtp_module_params(m), q);
    for (int i = 0; i < m.mtp_layers; ++i) {
      LayerRecord r;
      r.kind = kind_index(d, m, p, spec, like);
      r.stage = q.pp - 1;
      r.vchunk = q.vpp - 1;
      r.inflight = 1;
      r.mtp = true;
      d.layers.push_back(r);
      add_unit(last, module);
    }
    last.has_moe = last.has_moe || spec.ffn == FfnKind::MoE;
  }
  mark_same_stages(d);
  return d;
}

void derive_options(DerivedPlan& d) {
  const Plan& p = *d.plan;
  d.moe_chunks = d.has_moe ? std::max(1, p.moe.ep_chunks) : 1;
  const DerivedPlan::RecomputeChoice choice{p.recompute, p.recompute_layers, p.recompute_method, p.recompute_modules};
  if (d.derived_recompute == choice) return;  // the rest reads only the recompute choice
  d.derived_recompute = choice;
  const bool full = p.recompute == Recompute::Full;
  for (LayerKind& k : d.kinds) {
    k.when_kept = layer_activation(*d.model, p, k.spec, false);
    k.when_recomputed = layer_activation(*d.model, p, k.spec, true);
  }
  for (StageRecord& st : d.stages) st.saved_activations = 0, st.kinds_present = 0;
  for (LayerRecord& r : d.layers) {
    // Megatron's block method recomputes the first recompute_layers of each virtual stage, uniform every layer
    // (one checkpoint per recompute_layers); MTP modules all.
    r.recomputed = full && (r.mtp || p.recompute_layers == 0 || p.recompute_method == RecomputeMethod::Uniform ||
                            r.pos < p.recompute_layers);
    const LayerKind& kind = d.kinds[r.kind];
    StageRecord& st = d.stages[r.stage];
    st.saved_activations += r.inflight * (r.recomputed ? kind.when_recomputed : kind.when_kept).saved;
    st.kinds_present |= uint64_t(1) << (2 * r.kind + (r.recomputed ? 1 : 0));
  }
  // Alike stages differ only in the activations they save: the one saving the most (the first of equals) peaks.
  d.peak_stages.clear();
  for (int r = 0; r < int(d.stages.size()); ++r) {
    const int s = d.stages[r].same_as;
    if (s == r) d.peak_stages.push_back(r);
    else
      for (int& q : d.peak_stages)
        if (d.stages[q].same_as == s && d.stages[r].saved_activations > d.stages[q].saved_activations) q = r;
  }
}

}  // namespace lcplan
