#include "estimator/time_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "estimator/flops.h"
#include "estimator/frameworks.h"
#include "estimator/run_physics.h"
#include "parallel/chunk_schedule.h"

namespace lcplan {

namespace {

constexpr double kBf16 = 2;  // bytes per bf16 element
constexpr double kFp32 = 4;  // bytes per fp32 element

}  // namespace

double efficiency_curve(double max, double half, double x) {
  // Saturating efficiency by op size (Calculon, https://github.com/calculon-ai/calculon, and SimuMax,
  // https://github.com/AntGroup/SimuMax: efficiency keyed by op shape).
  return x <= 0 ? 0 : max * x / (x + half);
}

// FlashAttention-3 (arXiv 2407.08608, figures 5-7) runs head dim 64 at about 3/4 of head dim 128's rate; dims of 128
// and more run at the calibrated rate.
double attention_head_dim_factor(double head_dim) { return std::min(1.0, 1.5 * head_dim / (head_dim + 64)); }

// The backward runs 5 matmuls to the forward's 2 (FlashAttention-2 paper, arXiv 2307.08691); above head dim 128 it is
// slower per FLOP (no published rate: calibration.attention_wide_head_backward at 256, linear from 128).
double attention_backward_units(double head_dim, const Calibration& cal) {
  const double wide = std::clamp((head_dim - 128) / 128, 0.0, 1.0);
  return 2.5 / (1 - wide * (1 - cal.attention_wide_head_backward));
}

double collective_seconds(Collective c, double bytes, int n, LinkTier tier, int nodes, const Hardware& hw,
                          const Calibration& cal) {
  if (n <= 1 || bytes <= 0) return 0;
  const bool net = tier == LinkTier::Network;
  const double alpha = net ? cal.network_latency : cal.nvlink_latency;
  const double ring_bw = net ? hw.network_bandwidth * cal.network_efficiency : hw.nvlink_bandwidth * cal.nvlink_efficiency;
  const double frac = double(n - 1) / n;
  // Bus-bandwidth factors of nccl-tests (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
  switch (c) {
    case Collective::AllReduce: return alpha + bytes * 2 * frac / ring_bw;  // 2(n-1)/n
    case Collective::AllGather:
    case Collective::ReduceScatter: return alpha + bytes * frac / ring_bw;  // (n-1)/n
    case Collective::SendRecv: return alpha + bytes / ring_bw;
    case Collective::AllToAll: {
      // (n-1)/n of the buffer leaves the rank; across nodes the off-node share rides the NIC, the rest NVLink.
      const double nvl = hw.nvlink_bandwidth * cal.a2a_nvlink_efficiency;
      if (!net) return alpha + bytes * frac / nvl;
      const double off_node = bytes * (1.0 - 1.0 / std::max(nodes, 1));
      const double on_node = bytes * frac - off_node;
      return alpha + std::max(off_node / (hw.network_bandwidth * cal.a2a_network_efficiency), on_node / nvl);
    }
  }
  return 0;
}

// Groups (ranks or nodes holding E/g experts each) one token's k distinct experts reach on average:
// g (1 - C(E - E/g, k) / C(E, k)), the experts drawn without replacement.
double distinct_groups(double experts, double groups, double k) {
  double none = 1;  // the chance a given group holds none of the token's experts
  for (int i = 0; i < int(k); ++i) none *= std::max(0.0, experts - experts / groups - i) / (experts - i);
  return groups * (1 - none);
}

// Bins (ranks or nodes, E/R contiguous experts each) one token reaches. Group-limited routing (DeepSeek-V3: the
// top topk_group of n_group contiguous expert groups, then top-k inside them; Megatron-LM router.py group_limited_topk)
// draws the k experts from topk_group * E / n_group; with bins no wider than a group the chosen groups span
// topk_group * R / n_group bins, else the groups chosen land on distinct_groups(n_group, R, topk_group) bins.
double bins_reached(const MoeSpec& e, double bins) {
  const double experts = e.num_experts, k = e.top_k;
  const int g = e.n_group, t = e.topk_group, r = int(bins);
  if (e.router != RouterKind::SigmoidGroupLimited || g <= 1 || t >= g || r < 1) return distinct_groups(experts, bins, k);
  const double candidates = double(t) * experts / g;
  if (r % g == 0) return distinct_groups(candidates, double(t) * r / g, k);
  if (g % r == 0) return distinct_groups(candidates, distinct_groups(g, bins, t), k);
  return distinct_groups(experts, bins, k);  // groups and bins do not align: the unrestricted count
}

namespace {

// Seconds for a given amount of work on this hardware under this calibration, by kernel class.
struct KernelRates {
  const Hardware& hw;
  const Calibration& cal;
  double gemm_peak;          // peak of the plan's precision for GEMMs (low precision applies to GEMMs only)
  double gemm_scale = 1;     // efficiency of the plan's precision relative to bf16 (1 in bf16)
  double grouped_scale = 1;  // the same for grouped expert GEMMs
  double quantize_bytes;     // HBM bytes per GEMM input/output element to quantize it (0 in bf16)
  double attention_rate;     // flash attention's rate relative to bf16 (fp8 attention: the calibrated speedup)
  EffectiveSwitches sw;      // the plan's overlap and fusion switches as its framework runs them
  LaunchShares launch;       // the launch floors CUDA graphs leave

  KernelRates(const DerivedPlan& d, const Hardware& hw_, const Calibration& cal_)
      : hw(hw_), cal(cal_), sw(d.switches), launch(graph_launch_shares(*d.plan, cal_)) {
    const Plan& p = *d.plan;
    gemm_peak = gemm_peak_flops(hw, p.precision);
    const bool low = p.precision != Precision::BF16;
    switch (p.precision) {
      case Precision::BF16: gemm_scale = grouped_scale = 1.0; break;
      case Precision::FP8: gemm_scale = cal.fp8_gemm_ratio, grouped_scale = cal.fp8_grouped_gemm_ratio; break;
      case Precision::MXFP8: gemm_scale = cal.mxfp8_gemm_ratio, grouped_scale = cal.mxfp8_grouped_gemm_ratio; break;
      case Precision::NVFP4: gemm_scale = cal.nvfp4_gemm_ratio, grouped_scale = cal.nvfp4_grouped_gemm_ratio; break;
    }
    if (gemm_peak <= hw.peak_bf16_flops) gemm_scale = grouped_scale = 1.0;  // no faster tensor cores: the bf16 rate
    quantize_bytes = low ? cal.quantize_bytes_per_element : 0.0;
    attention_rate = p.fp8.attention && low ? cal.fp8_attention_speedup : 1.0;
  }
  double gemm(double flops, double tokens) const {
    return flops / (gemm_peak * gemm_scale * efficiency_curve(cal.gemm_efficiency, cal.gemm_half_tokens, tokens));
  }
  double grouped_gemm(double flops, double tokens_per_expert) const {
    return flops / (gemm_peak * grouped_scale *
                    efficiency_curve(cal.grouped_gemm_efficiency, cal.grouped_gemm_half_tokens, tokens_per_expert));
  }
  // attention_efficiency is the causal kernel's rate (every unsplit sequence's); unmasked kernels run faster by
  // 1 / attention_causal_ratio (cuDNN and FlashAttention-3, arXiv 2407.08608 figures 5-7).
  double attention(double flops, double local_seq, double head_dim, double causal_share) const {
    const double unmasked = (1 - causal_share) * cal.attention_causal_ratio;
    return flops * (causal_share + unmasked) /
           (hw.peak_bf16_flops * attention_rate * attention_head_dim_factor(head_dim) *
            efficiency_curve(cal.attention_efficiency, cal.attention_half_seq, local_seq));
  }
  // Quantizing `elements` GEMM inputs/outputs (memory-bound; 0 in bf16).
  double quantize(double elements) const { return memory_bound(quantize_bytes * elements); }
  double linear_attention(double flops) const { return flops / (hw.peak_bf16_flops * cal.linear_attention_efficiency); }
  double memory_bound(double bytes) const { return bytes / (hw.hbm_bandwidth * cal.hbm_efficiency); }
  double collective(Collective c, double bytes, const GroupFacts& g) const {
    return collective_seconds(c, bytes, g.size, g.tier, g.nodes, hw, cal);
  }
};

// The executors' chunk schedules (parallel/chunk_schedule.h), built once: index 2*(chunks-1) + shared_expert.
const moe::ChunkSchedule& schedule_for(int chunks, bool shared_expert) {
  static const std::array<moe::ChunkSchedule, 2 * moe::kMaxChunks> table = [] {
    std::array<moe::ChunkSchedule, 2 * moe::kMaxChunks> t;
    for (int n = 1; n <= moe::kMaxChunks; ++n)
      for (int s = 0; s < 2; ++s) t[2 * (n - 1) + s] = moe::make_chunk_schedule(n, {}, s == 1);
    return t;
  }();
  return table[2 * (chunks - 1) + (shared_expert ? 1 : 0)];
}

// Any MoE kind (the FFN part is the same in every MoE layer).
const LayerKind* moe_kind(const DerivedPlan& d) {
  for (const LayerKind& k : d.kinds)
    if (k.spec.ffn == FfnKind::MoE) return &k;
  return nullptr;
}

// One chunk's token exchange on the EP group: {forward dispatch, each of combine and the two backward exchanges}.
// Per chunk one call: its fixed cost (DeepEP-style launch and layout, FSMoE's alpha) plus bytes. The alltoall
// dispatcher sends every routed copy in bf16. DeepEP (and HybridEP) send the forward dispatch in the GEMM input
// format and each token once per destination rank (the receiver expands it to its local experts and sums their
// outputs before the combine: DeepEP get_dispatch_layout is_token_in_rank), and across nodes once per destination
// node (forwarded inside the node over NVLink), of which a share (N-1)/N is remote. The allgather dispatcher gathers
// every rank's tokens and reduce-scatters the outputs back (Megatron-LM token_dispatcher.py
// MoEAllGatherTokenDispatcher), whatever the routing.
std::pair<double, double> dispatch_seconds(const DerivedPlan& d, const KernelRates& rate, double copies, int n) {
  if (d.ep.size <= 1) return {0, 0};
  const Plan& p = *d.plan;
  const Calibration& cal = rate.cal;
  // Latent MoE exchanges latent-width tokens (assumed: its down-projection runs before the dispatch, the point of it).
  const double h = routed_width(*d.model);
  if (p.moe.dispatcher == MoeDispatcher::AllGather) {
    const double gathered = d.hidden_tokens * d.ep.size * h * kBf16 / n;
    const double t = rate.collective(Collective::AllGather, gathered, d.ep);
    return {t, t};
  }
  const bool dedup = deduplicating(p.moe.dispatcher);
  const MoeSpec& e = d.model->moe;
  const double nodes = d.ep.nodes, k = e.top_k;
  const double remote_per_copy =
      nodes > 1 ? (dedup ? bins_reached(e, nodes) * (nodes - 1) / nodes / k : (nodes - 1) / nodes) : 0;
  const double sent_per_copy = dedup ? bins_reached(e, d.ep.size) / k : 1.0;  // copies that cross NVLink
  auto a2a_of = [&](double bytes_per_element) {
    const double bytes = copies / n * h * bytes_per_element;
    const double nvl = rate.hw.nvlink_bandwidth * cal.a2a_nvlink_efficiency;
    if (nodes <= 1) return cal.a2a_latency + cal.nvlink_latency + bytes * sent_per_copy * (d.ep.size - 1) / d.ep.size / nvl;
    const double off_node = bytes * remote_per_copy;
    const double on_node = sent_per_copy * (bytes * (d.ep.size - 1) / d.ep.size - bytes * (nodes - 1) / nodes);
    return cal.a2a_latency + cal.network_latency + std::max(off_node / (rate.hw.network_bandwidth * cal.a2a_network_efficiency),
                                                            std::max(on_node, 0.0) / nvl);
  };
  return {a2a_of(dedup ? gemm_input_bytes(p.precision, p.fp8.recipe) : kBf16), a2a_of(kBf16)};
}

MoeLayerTime moe_time(const DerivedPlan& d, const KernelRates& rate) {
  const ModelSpec& m = *d.model;
  const Calibration& cal = rate.cal;
  const MoeSpec& e = m.moe;
  const double h = m.hidden;
  const int n = d.moe_chunks;
  const LayerFlops& lf = moe_kind(d)->flops;
  const double sp_tp = d.sequence_parallel ? d.tp.size : 1.0;
  const double copies = d.routed_tokens;  // routed token copies on this rank, busiest rank's load
  const double flops_per_copy = lf.routed / (d.seq * e.top_k) / d.plan->parallel.etp;

  const LayerTraffic& tr = moe_kind(d)->traffic;
  const double etp = d.plan->parallel.etp;
  // Router (SP-local tokens, full weights) and shared experts (TP-sharded, gathered tokens): plain GEMMs, the shared
  // expert with its quantization and activation traffic (split 3:5 and 1:1 forward:backward by element count).
  const double router = rate.gemm(lf.router * d.sequence_share / sp_tp, d.hidden_tokens);
  // Latent MoE's projections, like the router on the SP-local tokens with whole weights, quantized in a low-precision
  // recipe (each pass quantizes h + latent elements per token: the inputs forward, the output gradients backward).
  const double latent_gemm = lf.latent > 0 ? rate.gemm(lf.latent * d.sequence_share / sp_tp, d.hidden_tokens) : 0;
  const double latent_quant = lf.latent > 0 ? rate.quantize((h + e.latent) * d.hidden_tokens) : 0;
  const double shared_io = tr.mlp_io * d.local_tokens / d.tp.size, shared_act = tr.act * d.local_tokens / d.tp.size;
  const double shared_fwd = lf.shared > 0 ? rate.gemm(lf.shared * d.sequence_share / d.tp.size, d.local_tokens) +
                                                rate.quantize(shared_io / 2) + rate.memory_bound(kBf16 * shared_act * 3 / 8)
                                          : 0;
  const double shared_bwd = lf.shared > 0 ? 2 * rate.gemm(lf.shared * d.sequence_share / d.tp.size, d.local_tokens) +
                                                rate.quantize(shared_io / 2) + rate.memory_bound(kBf16 * shared_act * 5 / 8)
                                          : 0;
  // n smaller grouped GEMMs, each over a chunk's tokens per local expert, plus the routed copies' quantization and
  // activation traffic (the expert ffn is split over etp ranks).
  const double routed = rate.grouped_gemm(copies * flops_per_copy, d.tokens_per_local_expert / n);  // all n chunks
  const double routed_quant = rate.quantize(tr.routed_gemm_io / etp * copies);
  const double routed_act = rate.memory_bound(kBf16 * tr.routed_act / etp * copies);
  // Permutation before dispatch and weighted unpermutation after combine: memory-bound passes over the copies, more of
  // them without fused permutation (--moe-permute-fusion).
  // The alltoall dispatcher also sorts what it receives by local expert and unsorts it before the combine (a read and
  // a write each) when a rank holds more than one expert (Megatron-LM token_dispatcher.py sort_chunks_by_idxs).
  const int local_experts = e.num_experts / d.ep.size;
  const double sorts = d.plan->moe.dispatcher == MoeDispatcher::AllToAll && d.ep.size > 1 && local_experts > 1 ? 4 : 0;
  const double passes = cal.moe_permute_passes + sorts + (rate.sw.permute_fusion ? 0.0 : cal.unfused_permute_passes);
  const double permute = rate.memory_bound(passes * copies * routed_width(m) * kBf16) / 2;
  // Per layer forward, dropless routing needs the token counts on the host to size its buffers (a count exchange +
  // device-to-host sync); token dropping with padding has static shapes and skips it, as a captured graph does.
  const std::pair<double, double> exchange = dispatch_seconds(d, rate, copies, n);
  const double dispatch = exchange.first, a2a = exchange.second;
  const bool static_shapes = static_moe_shapes(*d.plan);
  const double sync = static_shapes || !rate.launch.sync ? 0 : cal.moe_sync_seconds;
  // Kernels of one chunk's expert step, less what a CUDA graph captures.
  const double floor = cal.kernels_per_moe_chunk * cal.launch_seconds * rate.launch.moe_chunk;
  // Without chunking the expert backward runs dgrad and wgrad back to back (no delayed wgrad, Megatron's default).
  const bool delayed_wgrad = n > 1;
  const moe::ChunkSchedule& sched = schedule_for(n, lf.shared > 0);
  using moe::StepOp;
  using Seconds = std::pair<double, double>;  // {time, floor}
  std::array<double, 64> end{};  // schedules have at most 2 + 5*kMaxChunks + 2 steps per pass
  const moe::PassCost fw = moe::cost_steps(sched.forward, [&](const moe::Step& st) -> Seconds {
    switch (st.op) {
      case StepOp::Route: return {router + latent_gemm + latent_quant, 0};  // the up-projection after the combine too
      case StepOp::Counts: return {sync, 0};
      case StepOp::Permute: case StepOp::Unpermute: return {permute / n, 0};
      case StepOp::Dispatch: return {dispatch, 0};
      case StepOp::Combine: return {a2a, 0};
      case StepOp::SharedFwd: return {shared_fwd, 0};
      case StepOp::ExpertFwd: return {(routed + routed_quant / 2 + routed_act * 3 / 8) / n, floor};
      default: return {0, 0};
    }
  }, end.data());
  const moe::PassCost bw = moe::cost_steps(sched.backward, [&](const moe::Step& st) -> Seconds {
    switch (st.op) {
      case StepOp::UnpermuteBwd: case StepOp::PermuteBwd: return {2 * permute / n, 0};
      case StepOp::CombineBwd: case StepOp::DispatchBwd: return {a2a, 0};
      case StepOp::SharedBwd: return {shared_bwd, 0};
      case StepOp::ExpertDgrad:
        return {((delayed_wgrad ? 1 : 2) * routed + routed_quant / 2 + routed_act * 5 / 8) / n, 2 * floor};
      case StepOp::ExpertWgrad: return {delayed_wgrad ? routed : 0, 0};
      case StepOp::RouterBwd: return {2 * (router + latent_gemm) + latent_quant, 0};
      default: return {0, 0};
    }
  }, end.data());
  MoeLayerTime t;
  // Exposed communication: the span beyond the compute stream's own work; the rest of the traffic ran beside
  // compute and slows it (interference, Mist, EuroSys'25, https://doi.org/10.1145/3689031.3717461).
  t.exposed_comm_forward = std::max(0.0, fw.makespan - fw.compute_busy);  // rounding can leave -1e-14
  t.exposed_comm_backward = std::max(0.0, bw.makespan - bw.compute_busy);
  t.launch_forward = fw.floor_excess;
  t.launch_backward = bw.floor_excess;
  t.forward = fw.makespan + cal.interference * std::max(0.0, fw.comm_busy - t.exposed_comm_forward);
  t.backward = bw.makespan + cal.interference * std::max(0.0, bw.comm_busy - t.exposed_comm_backward);
  t.shared_forward = shared_fwd;
  t.activation_forward = routed_act * 3 / 8;
  t.shared_activation_forward = lf.shared > 0 ? rate.memory_bound(kBf16 * shared_act * 3 / 8) : 0;
  return t;
}

// Context-parallel communication of one attention layer, forward and backward (seconds).
struct CpCost {
  double exposed_fwd = 0, exposed_bwd = 0;  // on the critical path
  double hidden = 0, hidden_forward = 0;    // overlapped with attention (both passes, forward alone)
};

// --cp-comm-type: p2p exchanges K/V around a ring under the attention kernels (costed as the all-gather of the
// sequence's K/V, hidden up to the attention time, with dK/dV reduce-scattered backward); all_gather gathers K/V
// before attention, not overlapped; a2a (Ulysses, arXiv 2309.14509) swaps sequence for heads with all-to-alls of q,
// k, v before attention and of its output after, not overlapped; a2a+p2p runs a2a inside groups of cp_a2a_size and
// the ring across them (TransformerEngine attention.py, Megatron-LM arguments.py --hierarchical-context-parallel-sizes).
CpCost cp_attention(const DerivedPlan& d, const KernelRates& rate, MixerKind mixer, double core_fwd, double core_bwd) {
  const ModelSpec& m = *d.model;
  const Plan& p = *d.plan;
  const double tp = d.tp.size;
  double kv_dim = 0, q_dim = 0;
  if (mixer == MixerKind::FullAttention) {
    kv_dim = 2.0 * m.attn.kv_heads * m.attn.head_dim;
    q_dim = double(m.attn.heads) * m.attn.head_dim;
  } else {
    kv_dim = double(m.mla.heads) * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim);
    q_dim = double(m.mla.heads) * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim);
  }
  const CpComm type = p.comm.cp;
  const int a2a = type == CpComm::A2A ? d.cp.size : type == CpComm::A2AP2P ? std::max(1, p.comm.cp_a2a_size) : 1;
  GroupFacts inner = d.cp, ring = d.cp;
  inner.size = a2a;
  if (a2a < d.cp.size && a2a * d.tp.size <= d.gpus_per_node) inner.nodes = 1, inner.tier = LinkTier::NVLink;
  ring.size = d.cp.size / a2a;
  CpCost c;
  if (a2a > 1) {  // q, k, v in and the output back: each rank's share of them, both passes
    const double bytes = d.cp_split_tokens * (q_dim + kv_dim + q_dim) / tp * kBf16;
    c.exposed_fwd = c.exposed_bwd = rate.collective(Collective::AllToAll, bytes, inner);
  }
  if (ring.size <= 1) return c;
  // The sequence's K/V, this rank's heads, all-gathered around the ring and dK/dV reduce-scattered back; under hybrid
  // CP each split size's sequences in a ring of their own ranks (Megatron-LM's sub-groups of 2^i CP ranks).
  double comm_fwd = 0, comm_bwd = 0;
  auto exchange = [&](double chunk_tokens, GroupFacts g) {
    // Every ring rank's chunk of K/V (a2a+p2p: an a2a group's tokens over 1/a2a of the heads: the same bytes).
    const double gathered = chunk_tokens * g.size * kv_dim / tp * kBf16;
    const double gather = rate.collective(Collective::AllGather, gathered, g);
    comm_fwd += gather;
    comm_bwd += gather + rate.collective(Collective::ReduceScatter, gathered, g);
  };
  if (p.packed_splits.empty()) exchange(d.cp_split_tokens, ring);
  for (size_t i = 1; i < d.split_ring_tokens.size(); ++i) {
    const int ranks = 1 << i;
    if (d.split_ring_tokens[i] <= 0 || ranks <= a2a) continue;
    GroupFacts sub = ring;
    sub.size = ranks / a2a;
    // Its nodes, assuming a split's ranks are contiguous in the CP group (not sourced: the fewest nodes it can span).
    sub.nodes = std::max(1, (ring.nodes * sub.size + ring.size - 1) / ring.size);
    if (sub.nodes == 1) sub.tier = LinkTier::NVLink;
    exchange(d.split_ring_tokens[i], sub);
  }
  if (type == CpComm::AllGather) {
    c.exposed_fwd += comm_fwd;
    c.exposed_bwd += comm_bwd;
    return c;
  }
  const double fwd_exposed = std::max(0.0, comm_fwd - core_fwd), bwd_exposed = std::max(0.0, comm_bwd - core_bwd);
  c.exposed_fwd += fwd_exposed;
  c.exposed_bwd += bwd_exposed;
  c.hidden_forward = comm_fwd - fwd_exposed;
  c.hidden = c.hidden_forward + (comm_bwd - bwd_exposed);
  return c;
}

// Selective recompute of one layer: what its modules dropped, replayed before its backward (Megatron-LM
// transformer_config.py recompute_modules): core_attn the attention kernel (Korthikanti et al. 2022), layernorm the
// two norms, mla_up_proj the MLA up-projections, moe_act / mlp / shared_experts / moe their parts of the FFN.
double selective_recompute(const DerivedPlan& d, const KernelRates& rate, const LayerKind& kind, double core_fwd,
                           const MoeLayerTime& moe) {
  const ModelSpec& m = *d.model;
  const uint16_t mods = d.plan->recompute_modules;
  const LayerFlops& lf = kind.flops;
  const double share = d.sequence_share / d.tp.size;
  const bool moe_layer = kind.spec.ffn == FfnKind::MoE;
  const RecomputeScope scope = recompute_scope(*d.plan, kind.spec);
  double t = 0;
  if (mods & kRecomputeCoreAttn) t += core_fwd;
  // RMSNorm forward reads and writes a hidden-sized tensor, once per norm it rebuilds.
  const int norms = int(scope.mixer_norm) + int(scope.ffn_norm);
  const double norm_pass = rate.memory_bound(2 * d.hidden_tokens * m.hidden * kBf16);
  if (mods & kRecomputeLayernorm) t += norms * norm_pass;
  if ((mods & kRecomputeMlaUpProj) && kind.spec.mixer == MixerKind::MLA) {
    const MlaSpec& ml = m.mla;
    const double up = double(ml.heads) * ((ml.q_lora_rank > 0 ? ml.q_lora_rank * (ml.qk_nope_head_dim + ml.qk_rope_head_dim) : 0) +
                                          ml.kv_lora_rank * (ml.qk_nope_head_dim + ml.v_head_dim));
    t += rate.gemm(2 * up * d.seq * share, d.local_tokens);
  }
  const double dense_act = rate.memory_bound(kBf16 * kind.traffic.act * d.local_tokens / d.tp.size * 3 / 8);
  if (!moe_layer && (mods & kRecomputeMlp))  // with the norm fused into its fc1, where the framework fuses it
    t += rate.gemm(lf.dense_mlp * share, d.local_tokens) + dense_act + (scope.ffn_norm ? 0 : norm_pass);
  else if (!moe_layer && (mods & kRecomputeMoeAct) && scope.other_mlp_act) t += dense_act;
  if (moe_layer && (mods & kRecomputeMoe)) t += moe.forward;
  else if (moe_layer) {
    if (mods & kRecomputeSharedExperts) t += moe.shared_forward;
    if (mods & kRecomputeMoeAct) t += moe.activation_forward;
    if ((mods & kRecomputeMoeAct) && !(mods & kRecomputeSharedExperts) && scope.other_mlp_act)
      t += moe.shared_activation_forward;
  }
  return t;
}

// A distributed checkpoint's input (Plan::distribute_saved_activations) is all-gathered over TP before its replay,
// once per checkpoint of recompute_layers layers with the uniform method (tensor_parallel/random.py gather_split_1d_tensor).
double checkpoint_regather(const DerivedPlan& d, const KernelRates& rate) {
  const Plan& p = *d.plan;
  if (!p.distribute_saved_activations) return 0;
  const double layers = layers_per_checkpoint(p);
  GroupFacts tp = d.tp;
  tp.nodes = 1;  // ring collectives do not use the node count
  return rate.collective(Collective::AllGather, d.local_tokens * d.model->hidden * kBf16, tp) / layers;
}

// One decoder layer (or MTP layer body) for one microbatch on this rank.
LayerCost layer_cost(const DerivedPlan& d, const KernelRates& rate, const LayerKind& kind, bool recomputed,
                     const MoeLayerTime& moe) {
  const ModelSpec& m = *d.model;
  const Calibration& cal = rate.cal;
  const double h = m.hidden;
  const LayerFlops& lf = kind.flops;
  const double tp = d.tp.size, cp = d.cp.size;
  const double share = d.sequence_share / tp;  // this rank's share of one sequence's FLOPs
  LayerCost k;
  double fwd = rate.gemm(lf.proj * share, d.local_tokens);  // non-MoE forward GPU compute
  double core_fwd = 0, core_bwd = 0;
  if (lf.attn_core > 0) {
    const double head_dim = kind.spec.mixer == MixerKind::MLA ? double(m.mla.qk_nope_head_dim) + m.mla.qk_rope_head_dim
                                                              : m.attn.head_dim;
    // A sliding window's query tile walks about window / tile key tiles, as a causal sequence of twice the window
    // does: the kernel runs at that length's rate (FlashAttention-3's rate by sequence length).
    const double kernel_seq =
        kind.spec.sliding ? std::min(d.attention_seq, 2.0 * m.attn.sliding_window) : d.attention_seq;
    core_fwd = rate.attention(lf.attn_core * share, kernel_seq, head_dim, d.causal_share);
    core_bwd = attention_backward_units(head_dim, rate.cal) * core_fwd;
  } else if (lf.linear_core > 0) {
    core_fwd = rate.linear_attention(lf.linear_core * share);
    core_bwd = 2 * core_fwd;
  }
  if (lf.dense_mlp > 0) fwd += rate.gemm(lf.dense_mlp * share, d.local_tokens);
  fwd += rate.memory_bound(cal.elementwise_passes * d.hidden_tokens * h * kBf16);
  double bwd = 2 * fwd + core_bwd;  // backward = dgrad + wgrad for GEMMs, 2x for elementwise
  fwd += core_fwd;
  // Quantization of GEMM inputs (forward) and output gradients (backward) in low precision, and the dense MLP's
  // activation traffic (3 of its 8 elements per token forward); the MoE layer costs its own (moe_time).
  const LayerTraffic& tr = kind.traffic;
  const double io = (tr.mixer_io + (lf.dense_mlp > 0 ? tr.mlp_io : 0)) * d.local_tokens / tp;
  const double act = lf.dense_mlp > 0 ? tr.act * d.local_tokens / tp : 0;
  fwd += rate.quantize(io / 2) + rate.memory_bound(kBf16 * act * 3 / 8);
  bwd += rate.quantize(io / 2) + rate.memory_bound(kBf16 * act * 5 / 8);

  // TP: Megatron SP all-gather before and reduce-scatter after each TP block (or all-reduce without SP),
  // forward and backward alike (Korthikanti et al. 2022 section 4.2.2). MoE without shared experts has no TP block.
  double tp_fwd = 0;
  if (tp > 1) {
    const int blocks = 1 + (kind.spec.ffn == FfnKind::Dense || m.moe.shared_experts > 0 ? 1 : 0);
    const double bytes = d.local_tokens * h * kBf16;
    GroupFacts tp_group = d.tp;
    tp_group.nodes = 1;  // ring collectives do not use the node count
    tp_fwd = blocks * (d.sequence_parallel ? rate.collective(Collective::AllGather, bytes, tp_group) +
                                                 rate.collective(Collective::ReduceScatter, bytes, tp_group)
                                           : rate.collective(Collective::AllReduce, bytes, tp_group));
  }
  // A share hides under the GEMMs (asynchronous collectives); TE userbuffers (--tp-comm-overlap, which needs sequence
  // parallelism) split each all-gather / reduce-scatter into chunks pipelined with the GEMM's chunks, so the GEMMs'
  // forward time hides it (TransformerEngine comm_gemm_overlap, https://github.com/NVIDIA/TransformerEngine).
  const double tp_hidden = rate.sw.tp_overlap && d.sequence_parallel ? std::min(tp_fwd, fwd) : cal.tp_overlap * tp_fwd;
  const double tp_exposed = tp_fwd - tp_hidden;

  // CP: full attention / MLA exchange K/V (cp_attention); gated DeltaNet uses head-parallel all-to-all before and
  // after the delta rule, not hidden (README "Context parallelism").
  CpCost cpc;
  if (cp > 1) {
    const MixerKind mixer = kind.spec.mixer;
    if (mixer == MixerKind::FullAttention || mixer == MixerKind::MLA) {
      cpc = cp_attention(d, rate, mixer, core_fwd, core_bwd);
    } else if (mixer == MixerKind::LinearAttention) {
      const LinearAttentionSpec& g = m.linear;
      const double kd = double(g.key_heads) * g.key_head_dim, vd = double(g.value_heads) * g.value_head_dim;
      const double a2a = rate.collective(Collective::AllToAll, d.cp_split_tokens * (2 * kd + vd) / tp * kBf16, d.cp) +
                         rate.collective(Collective::AllToAll, d.cp_split_tokens * vd / tp * kBf16, d.cp);
      cpc.exposed_fwd = a2a;
      cpc.exposed_bwd = a2a;
    }
  }
  const double cp_exposed_fwd = cpc.exposed_fwd, cp_exposed_bwd = cpc.exposed_bwd;
  const double cp_hidden = cpc.hidden, cp_hidden_forward = cpc.hidden_forward;

  // Launch floor: a layer cannot run faster than its kernels can be launched. The host launches ahead while the
  // GPU waits on an exposed collective or runs slowed by a hidden one, so the floor bounds the whole GPU span of
  // the layer's non-MoE part, not its compute alone (else a faster kernel could lengthen the step).
  // CUDA graphs launch what they captured as one graph (graph_launch_shares).
  const double floor_fwd = cal.kernels_per_layer * cal.launch_seconds *
                           (kind.spec.ffn == FfnKind::MoE ? rate.launch.moe_layer : rate.launch.dense_layer);
  // Interference of the TP (the same collectives each way) and CP collectives each direction hides.
  const double slowed_fwd = cal.interference * (tp_hidden / 2 + cp_hidden_forward);
  const double slowed_bwd = cal.interference * (tp_hidden / 2 + cp_hidden - cp_hidden_forward);
  const double span_fwd = fwd + tp_exposed + cp_exposed_fwd + slowed_fwd;
  const double span_bwd = bwd + tp_exposed + cp_exposed_bwd + slowed_bwd;
  const double launch_fwd = std::max(0.0, floor_fwd - span_fwd), launch_bwd = std::max(0.0, 2 * floor_fwd - span_bwd);
  const double interference = cal.interference * (tp_hidden + cp_hidden);

  const bool moe_layer = kind.spec.ffn == FfnKind::MoE;
  const double moe_fwd = moe_layer ? moe.forward - moe.exposed_comm_forward - moe.launch_forward : 0;
  const double moe_bwd = moe_layer ? moe.backward - moe.exposed_comm_backward - moe.launch_backward : 0;
  k.forward = fwd + moe_fwd;
  k.backward = bwd + moe_bwd;
  k.attention = core_fwd + core_bwd;
  k.moe = moe_fwd + moe_bwd;
  k.compute = k.forward + k.backward + interference;
  k.tp = 2 * tp_exposed;
  k.cp = cp_exposed_fwd + cp_exposed_bwd;
  k.cp_hidden = cp_hidden;
  // Cross-microbatch all-to-all overlap (Megatron --overlap-moe-expert-parallel-comm) hides a further share.
  // It pairs one microbatch's forward with another's backward, which full recompute does not support (article
  // section 2.4: the reason chunked EP exists), so recomputed layers get none of it.
  // It can hide at most the other microbatch's compute of this layer.
  const double ep_overlap = recomputed || !d.plan->moe.a2a_overlap ? 0.0 : cal.ep_overlap;
  const double ep_exposed = moe_layer ? moe.exposed_comm_forward + moe.exposed_comm_backward : 0;
  const double ep_hidden = std::min(ep_overlap * ep_exposed, k.forward + k.backward);
  k.ep = ep_exposed - ep_hidden;
  k.compute += cal.interference * ep_hidden;
  k.launch = launch_fwd + launch_bwd + (moe_layer ? moe.launch_forward + moe.launch_backward : 0);
  // By phase: each direction's non-MoE span and launch floor, its MoE compute, exposed all-to-alls and launch floor,
  // and the EP overlap's interference in proportion to what each direction overlapped.
  const double ep_fwd_share = ep_exposed > 0 ? (moe_layer ? moe.exposed_comm_forward : 0) / ep_exposed : 0.5;
  const double ep_kept = ep_exposed > 0 ? 1 - ep_hidden / ep_exposed : 1;
  k.in_forward = span_fwd + launch_fwd + moe_fwd + (moe_layer ? moe.exposed_comm_forward * ep_kept + moe.launch_forward : 0) +
                 cal.interference * ep_fwd_share * ep_hidden;
  k.in_backward = span_bwd + launch_bwd + moe_bwd + (moe_layer ? moe.exposed_comm_backward * ep_kept + moe.launch_backward : 0) +
                  cal.interference * (1 - ep_fwd_share) * ep_hidden;
  if (recomputed) {
    // Full recompute replays the forward, its collectives and its all-to-alls (x2 EP traffic), and the hidden
    // collectives slow the replayed kernels as they slowed the forward's (the launch floor bounds the same span).
    k.recompute = k.forward + slowed_fwd;
    const double regather = checkpoint_regather(d, rate);
    k.tp += tp_exposed + regather;
    k.in_backward += regather;
    k.cp += cp_exposed_fwd;
    k.cp_hidden += cp_hidden_forward;
    k.ep += moe_layer ? moe.exposed_comm_forward : 0;  // the replayed forward is not paired with another microbatch
    k.launch += launch_fwd + (moe_layer ? moe.launch_forward : 0);
    // The replay runs right before the layer's backward.
    k.in_backward += k.recompute + tp_exposed + cp_exposed_fwd + (moe_layer ? moe.exposed_comm_forward : 0) +
                     launch_fwd + (moe_layer ? moe.launch_forward : 0);
  } else if (d.plan->recompute == Recompute::Selective) {
    k.recompute = selective_recompute(d, rate, kind, core_fwd, moe);  // the modules it dropped, replayed
    k.in_backward += k.recompute;
  }
  k.span_forward = k.in_forward + (1 - cal.interference) * ep_fwd_share * ep_hidden;
  k.span_backward = k.in_backward + (1 - cal.interference) * (1 - ep_fwd_share) * ep_hidden;
  return k;
}

// LM head + loss on the last stage for one microbatch (forward + backward): GEMMs plus the fp32 logits' memory
// traffic; linear CE streams the vocabulary and is slower by the calibrated factor (article section 2.3).
LayerCost loss_cost(const DerivedPlan& d, const KernelRates& rate, bool linear_ce) {
  const ModelSpec& m = *d.model;
  const double tp = d.tp.size;
  LayerCost k;
  const double head = rate.gemm(lm_head_forward_flops(m, d.seq) * d.sequence_share / tp, d.local_tokens);
  const double logits = d.local_tokens * double(m.vocab) / tp;
  const double elementwise = rate.memory_bound(4 * logits * kFp32);  // write logits, softmax read, grad write, grad read
  double t = 3 * head + elementwise;
  if (linear_ce) t *= rate.cal.linear_ce_slowdown;
  k.forward = t / 3;
  k.backward = t - k.forward;
  k.compute = t;
  if (tp > 1) {
    const double bytes = d.local_tokens * m.hidden * kBf16;
    GroupFacts tp_group = d.tp;
    tp_group.nodes = 1;
    k.tp = rate.collective(Collective::AllGather, bytes, tp_group) + rate.collective(Collective::ReduceScatter, bytes, tp_group);
  }
  k.in_loss = k.total();  // the loss phase runs the LM head and loss forward and backward
  return k;
}

// Bytes per microbatch each stage sends to the host and back: every saved activation under activation offload
// (--cpu-offloading), the offloaded modules' inputs of the layers that are not fully recomputed (--offload-modules).
// Empty when nothing is offloaded (the search estimates millions of plans).
std::vector<double> offloaded_per_stage(const DerivedPlan& d) {
  const Plan& p = *d.plan;
  std::vector<double> bytes;
  if (!p.offload.activations && !p.offload.modules) return bytes;
  bytes.assign(p.parallel.pp, 0.0);
  for (const LayerRecord& r : d.layers) {
    if (r.mtp) continue;
    const LayerActivation& la = r.recomputed ? d.kinds[r.kind].when_recomputed : d.kinds[r.kind].when_kept;
    bytes[r.stage] += (p.offload.activations ? la.saved : 0.0) + la.offloaded;
  }
  return bytes;
}

// The optimizer step over `shard` local parameters: memory-bound Adam on the device, and for the offloaded fraction
// (ZeRO-Offload, arXiv 2101.06840; Megatron's HybridDeviceOptimizer) gradients down and parameters up the host link
// and the update on the CPU, neither overlapping the step's compute.
double optimizer_step_seconds(const Plan& p, const KernelRates& rate, double shard, double host_bw) {
  const double f = p.offload.optimizer ? p.offload.optimizer_fraction : 0.0;
  const double on_device = rate.memory_bound(optimizer_step_bytes_per_param(p, rate.cal) * shard * (1 - f));
  const double on_host = f * (shard * (grad_bytes_per_param(p) + kBf16) / host_bw + shard / rate.cal.cpu_adam_params_per_second);
  return on_device + on_host;
}

}  // namespace

MoeLayerTime moe_layer_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal) {
  return d.has_moe ? moe_time(d, KernelRates(d, hw, cal)) : MoeLayerTime{};
}

TimeEstimate estimate_time(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  return estimate_time(derive_plan(m, p, hw), hw, cal);
}

namespace {

// Gradient clipping over `shard` local parameters (Megatron-LM clip_grads.py, on by default with --clip-grad 1.0):
// multi_tensor_l2norm reads each fp32 main gradient and multi_tensor_scale reads and writes it, 12 bytes a parameter,
// and the norm and the logged loss are each all-reduced over every rank (latency-bound scalars). A framework that
// does not clip reads the gradients for the norm it reports and sums it with the loss in one all-reduce.
double grad_clip_seconds(const DerivedPlan& d, const KernelRates& rate, double shard) {
  constexpr double kMainGradBytes = 4;  // the distributed optimizer's shard of main gradients is fp32
  const bool clips = rate.sw.clip_gradients;
  const bool across_nodes = d.plan->gpus > d.gpus_per_node;
  const double scalar = across_nodes ? rate.cal.network_latency : rate.cal.nvlink_latency;
  return rate.memory_bound((clips ? 3 : 1) * kMainGradBytes * shard) + (d.plan->gpus > 1 ? (clips ? 2 : 1) * scalar : 0.0);
}

// What a stage does after its passes (DP / FSDP collectives, optimizer step, offload), seconds per step.
struct After {
  double dp_exposed = 0, hidden_fwd = 0, hidden_bwd = 0;  // hidden under compute (slowed by interference)
  double optimizer = 0, offload = 0;
  double fsdp_fwd_share = 0;  // FSDP: the forward's share of the collectives (one gather of two, and no reduce)
  double total(double interference) const {
    return dp_exposed + interference * (hidden_fwd + hidden_bwd) + optimizer + offload;
  }
};

// After the pipeline: DP / FSDP collectives, the optimizer step and activation offload, per stage. Every stage
// lives through the clock's microbatch slots, so what it does not spend on its own passes it idles, and its
// collectives and copies use that first (for free: no compute to slow), then its passes' overlappable share
// (slowed by interference). The step ends when the stage with the most left over is done: the largest per-stage
// sum (not the clock stage's own, which would jump when a faster kernel moves the clock to a stage with other
// parameters, and would let a faster non-clock stage lose its idle).
After after_pipeline(const DerivedPlan& d, const KernelRates& rate, const StageCosts& costs, const LayerCost& last,
                     const LayerCost& c) {
  const Plan& p = *d.plan;
  const Parallel& q = p.parallel;
  const Calibration& cal = rate.cal;
  const double mb = d.microbatches;
  const double host_bw = rate.hw.host_bandwidth * cal.host_link_efficiency;
  const auto reduce = p.optimizer_sharding == OptimizerSharding::None ? Collective::AllReduce : Collective::ReduceScatter;
  const std::vector<double> saved = offloaded_per_stage(d);  // empty without activation offload
  After after;
  for (int r = 0; r < q.pp; ++r) {
    if (d.stages[r].same_as != r) continue;  // a stage like an earlier one leaves no more over
    const LayerCost& sc = r + 1 == q.pp ? last : costs.stages[r];
    const double dense = d.stages[r].params.dense, expert = d.stages[r].params.expert;
    const StageCosts::Comm& comm_of = costs.comm[r];
    const double grad_sync = reduce == Collective::AllReduce ? comm_of.grad_all_reduce : comm_of.grad_reduce_scatter;
    const double param_gather = comm_of.param_gather;
    // The passes' spans with their all-to-alls (LayerCost::span_forward), and the stage's idle per clock slot.
    const double span_fwd = sc.span_forward, span_bwd = sc.in_loss + sc.span_backward;
    const double idle = std::max(0.0, c.total() - sc.total());
    After a;
    double hidden_total = 0;  // under compute and idle alike (what an offload copy cannot use again)
    if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
      // FSDP (ZeRO-3): every microbatch gathers parameters for forward and again for backward (reshard after
      // forward) and reduce-scatters gradients, prefetched under that microbatch's span when the overlap switches
      // are on; by phase in proportion to the collectives each pass issues (one gather forward, a gather and the
      // reduce backward).
      const double comm = 2 * param_gather + grad_sync;
      const double overlappable = (rate.sw.fsdp_gather ? 2 * param_gather : 0) + (rate.sw.fsdp_reduce ? grad_sync : 0);
      const double under_idle = std::min(overlappable, idle);
      const double under_compute = std::min(overlappable - under_idle, cal.dp_overlap * (span_fwd + span_bwd));
      const double hidden = under_idle + under_compute;
      a.dp_exposed = mb * (comm - hidden);
      a.fsdp_fwd_share = comm > 0 ? param_gather / comm : 0;
      a.hidden_fwd = mb * a.fsdp_fwd_share * under_compute;
      a.hidden_bwd = mb * (1 - a.fsdp_fwd_share) * under_compute;
      hidden_total = mb * hidden;
    } else {
      // Megatron overlaps the grad reduce with the last microbatch's backward and the distributed optimizer's
      // parameter all-gather with the first microbatch's forward (--overlap-grad-reduce / --overlap-param-gather);
      // without them (or in a framework that does not overlap) both run after the backward.
      const double gather = p.optimizer_sharding == OptimizerSharding::DistOpt ? param_gather : 0;
      const double on_bwd = rate.sw.overlap_grad_reduce ? 1.0 : 0.0, on_fwd = rate.sw.overlap_param_gather ? 1.0 : 0.0;
      const double bwd_idle = std::min(grad_sync, on_bwd * idle);
      const double fwd_idle = std::min(gather, on_fwd * idle);
      const double bwd = std::min(grad_sync - bwd_idle, on_bwd * cal.dp_overlap * span_bwd);
      const double fwd = std::min(gather - fwd_idle, on_fwd * cal.dp_overlap * span_fwd);
      const double bwd_all = bwd_idle + bwd, fwd_all = fwd_idle + fwd;
      a.dp_exposed = (grad_sync - bwd_all) + (gather - fwd_all);
      a.hidden_fwd = fwd;
      a.hidden_bwd = bwd;
      hidden_total = bwd_all + fwd_all;
    }
    // Optimizer step: memory-bound Adam over this rank's optimizer shard.
    const double shard = p.optimizer_sharding == OptimizerSharding::None
                             ? dense + expert
                             : dense / std::max(1, d.dp_shard.size) + expert / std::max(1, d.edp_shard.size);
    a.optimizer = optimizer_step_seconds(p, rate, shard, host_bw) + grad_clip_seconds(d, rate, shard);
    if (!saved.empty()) {
      // Saved activations go to the host after each layer's forward and come back for its backward; the copy
      // engines run beside the microbatches' spans and idle, so only what exceeds that is exposed. The cover is
      // what the DP / FSDP collectives left: two streams hiding under the same time would otherwise each claim all
      // of it, and a faster kernel would expose both at once. The compute those collectives slow lasts longer by
      // the slowdown, and the copies run during it too (else idle that a faster clock takes away would cost the
      // collectives' slowdown and the copies' cover at once, more than the clock saved).
      const double copy = 2 * saved[r] / host_bw;
      const double slowed = cal.interference * (a.hidden_fwd + a.hidden_bwd);
      const double cover = std::max(0.0, mb * (cal.dp_overlap * (span_fwd + span_bwd) + idle) - hidden_total + slowed);
      a.offload = std::max(0.0, mb * copy - cover);
    }
    if (r == 0 || a.total(cal.interference) > after.total(cal.interference)) after = a;
  }
  return after;
}

// An MTP module's cost before its loss: eh_proj on [embedding; hidden] and its decoder layer.
LayerCost mtp_cost(const LayerCost& layer, bool recomputed, double eh_proj) {
  LayerCost c = layer;
  c.compute += 3 * eh_proj;
  c.forward += eh_proj;
  c.backward += 2 * eh_proj;
  c.in_forward += eh_proj;
  c.in_backward += 2 * eh_proj;
  c.span_forward += eh_proj;
  c.span_backward += 2 * eh_proj;
  if (recomputed) c.recompute += eh_proj, c.in_backward += eh_proj, c.span_backward += eh_proj;
  return c;
}

// The stages' gradient reduction (all-reduce or reduce-scatter) and parameter gather over DP-CP and expert DP.
void stage_comm(const DerivedPlan& d, const KernelRates& rate, StageCosts& out) {
  out.comm.assign(d.stages.size(), StageCosts::Comm{});
  const double grad_bytes = grad_bytes_per_param(*d.plan), gather_bytes = param_gather_bytes_per_param(*d.plan);
  for (size_t r = 0; r < d.stages.size(); ++r) {
    if (d.stages[r].same_as != int(r)) continue;
    const double dense = d.stages[r].params.dense, expert = d.stages[r].params.expert;
    StageCosts::Comm& c = out.comm[r];
    c.grad_all_reduce = rate.collective(Collective::AllReduce, dense * grad_bytes, d.dp_cp) +
                        rate.collective(Collective::AllReduce, expert * grad_bytes, d.edp_group);
    // The distributed optimizer reduce-scatters within its instance, then all-reduces each shard across instances
    // (Megatron DistributedDataParallelConfig num_distributed_optimizer_instances; one instance: no second step).
    c.grad_reduce_scatter = rate.collective(Collective::ReduceScatter, dense * grad_bytes, d.dp_shard) +
                            rate.collective(Collective::ReduceScatter, expert * grad_bytes, d.edp_shard);
    if (d.dp_instances.size > 1)
      c.grad_reduce_scatter += rate.collective(Collective::AllReduce, dense * grad_bytes / d.dp_shard.size, d.dp_instances);
    if (d.edp_instances.size > 1)
      c.grad_reduce_scatter +=
          rate.collective(Collective::AllReduce, expert * grad_bytes / d.edp_shard.size, d.edp_instances);
    c.param_gather = rate.collective(Collective::AllGather, dense * gather_bytes, d.dp_shard) +
                     rate.collective(Collective::AllGather, expert * gather_bytes, d.edp_shard);
  }
}

}  // namespace

StageCosts stage_costs(const DerivedPlan& d, const Hardware& hw, const Calibration& cal) {
  return stage_costs(d, hw, cal, moe_layer_time(d, hw, cal));
}

StageCosts stage_costs(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, const MoeLayerTime& moe) {
  const ModelSpec& m = *d.model;
  const Parallel& q = d.plan->parallel;
  const KernelRates rate(d, hw, cal);
  StageCosts out;
  out.moe = moe;
  // Each kind's cost, recomputed or not, once; then every decoder layer adds its kind's cost to its stage, for the
  // stages unlike any earlier one (a stage like an earlier one costs what that one costs, summed in the same order).
  out.kinds.resize(d.kinds.size());
  for (size_t k = 0; k < d.kinds.size(); ++k)
    for (int rec = 0; rec < 2; ++rec) out.kinds[k][rec] = layer_cost(d, rate, d.kinds[k], rec == 1, out.moe);
  out.stages.assign(d.stages.size(), LayerCost{});
  const double eh_proj = rate.gemm(2.0 * (2.0 * m.hidden) * m.hidden * d.local_tokens / q.tp, d.local_tokens);
  for (const LayerRecord& r : d.layers) {
    if (r.mtp) out.mtp.push_back(mtp_cost(out.kinds[r.kind][r.recomputed], r.recomputed, eh_proj));
    else if (d.stages[r.stage].same_as == r.stage) out.stages[r.stage].add(out.kinds[r.kind][r.recomputed]);
  }
  for (size_t r = 0; r < d.stages.size(); ++r) out.stages[r] = out.stages[d.stages[r].same_as];
  for (int lce = 0; lce < 2; ++lce) out.loss[lce] = loss_cost(d, rate, lce == 1);
  // PP: activations forward and gradients backward at every virtual-chunk boundary: on the critical path of plain
  // 1F1B; the interleaved schedule overlaps them with compute (Megatron-LM overlap_p2p_comm, on with vpp > 1).
  if (q.pp > 1 && q.vpp == 1) {
    GroupFacts pair = d.pp;
    pair.size = 2;
    out.pp_per_microbatch = 2.0 * rate.collective(Collective::SendRecv, d.hidden_tokens * m.hidden * kBf16, pair);
  }
  stage_comm(d, rate, out);
  return out;
}

TimeEstimate estimate_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal) {
  return estimate_time(d, hw, cal, stage_costs(d, hw, cal));
}

namespace {

// The pipeline's part of one step: the clock stage's microbatches, the PP transfers, the bubble and the step's fixed
// host time, before what each stage does after its passes (after_pipeline).
struct Pipeline {
  LayerCost last;  // the last stage with its MTP modules and loss
  int clock = 0;   // the slowest stage, the pipeline's clock
  TimeBreakdown br;
};

Pipeline pipeline(const DerivedPlan& d, const Calibration& cal, const StageCosts& costs, bool linear_ce) {
  const Parallel& q = d.plan->parallel;
  Pipeline pl;
  // The last stage adds each MTP module with its own LM head and loss, then the loss.
  const LayerCost& loss = costs.loss[linear_ce ? 1 : 0];
  pl.last = costs.stages.back();
  for (LayerCost c : costs.mtp) {
    c.add(loss);
    pl.last.add(c);
  }
  pl.last.add(loss);
  auto stage = [&](int r) -> const LayerCost& { return r + 1 == q.pp ? pl.last : costs.stages[r]; };
  for (int r = 1; r < q.pp; ++r)  // a stage like an earlier one is not slower
    if (d.stages[r].same_as == r && stage(r).total() > stage(pl.clock).total()) pl.clock = r;
  const LayerCost& c = stage(pl.clock);
  const double mb = d.microbatches;
  TimeBreakdown& br = pl.br;
  br.compute = mb * c.compute;
  br.compute_attention = mb * c.attention;
  br.compute_moe = mb * c.moe;
  br.recompute = mb * c.recompute;
  br.launch_overhead = mb * c.launch;
  br.exposed_comm.tp = mb * c.tp;
  br.exposed_comm.cp = mb * c.cp;
  br.hidden_cp = mb * c.cp_hidden;
  br.exposed_comm.ep = mb * c.ep;
  br.exposed_comm.pp = mb * costs.pp_per_microbatch;
  // Bubble (p-1)/(m*v) of the m microbatches' time (Narayanan et al. 2021, arXiv 2104.04473, section 2.2).
  br.bubble = double(q.pp - 1) / q.vpp * (c.total() + costs.pp_per_microbatch);
  br.step_overhead = cal.step_overhead_seconds * graph_launch_shares(*d.plan, cal).step_host;
  return pl;
}

double step_seconds(const TimeBreakdown& br) {
  return br.compute + br.recompute + br.exposed_comm.total() + br.bubble + br.launch_overhead + br.optimizer +
         br.offload + br.step_overhead;
}

double tokens_per_second_per_gpu(const DerivedPlan& d, double step_seconds) {
  return double(d.global_batch) * d.plan->seq_len / step_seconds / d.plan->gpus;
}

}  // namespace

double tokens_per_second_ceiling(const DerivedPlan& d, const Calibration& cal, const StageCosts& costs, bool linear_ce) {
  // What follows the pipeline's part is never negative but for rounding, far inside the margin.
  return tokens_per_second_per_gpu(d, step_seconds(pipeline(d, cal, costs, linear_ce).br) * (1 - 1e-9));
}

TimeEstimate estimate_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, const StageCosts& costs) {
  const Plan& p = *d.plan;
  const Parallel& q = p.parallel;
  const KernelRates rate(d, hw, cal);
  const Pipeline pl = pipeline(d, cal, costs, p.linear_ce);
  const LayerCost& last = pl.last;
  const LayerCost& c = pl.clock + 1 == q.pp ? pl.last : costs.stages[pl.clock];
  const double pp_per_microbatch = costs.pp_per_microbatch;
  const double mb = d.microbatches;
  TimeEstimate out;
  TimeBreakdown& br = out.breakdown;
  br = pl.br;

  const After after = after_pipeline(d, rate, costs, last, c);
  PhaseSeconds& ph = out.phases;
  const double dp_hidden = after.hidden_fwd + after.hidden_bwd;
  if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
    ph.forward += after.fsdp_fwd_share * after.dp_exposed + cal.interference * after.hidden_fwd;
    ph.backward += (1 - after.fsdp_fwd_share) * after.dp_exposed + cal.interference * after.hidden_bwd;
  } else {
    // What is not hidden runs between the last backward and the next forward, beside the optimizer step (the
    // executor's optimizer phase reduces gradients first and gathers parameters last).
    ph.optimizer += after.dp_exposed;
    ph.backward += cal.interference * after.hidden_bwd;
    ph.forward += cal.interference * after.hidden_fwd;
  }
  br.exposed_comm.dp_fsdp = after.dp_exposed;
  br.compute += cal.interference * dp_hidden;
  br.optimizer = after.optimizer;
  br.offload = after.offload;

  out.step_seconds = step_seconds(br);

  // The rest by phase: the microbatches' layer and loss time, the PP send forward / receive backward, the bubble in
  // proportion to the microbatch time it idles for ((p-1)/v of each pass), the offload copies half down after the
  // forward and half up for the backward, and the optimizer step with the step's fixed host time.
  const double f_mb = c.in_forward + pp_per_microbatch / 2, l_mb = c.in_loss;
  const double b_mb = c.in_backward + pp_per_microbatch / 2;
  const double t_mb = f_mb + l_mb + b_mb;
  const double bubble_per = t_mb > 0 ? br.bubble / t_mb : 0;
  ph.forward += mb * f_mb + bubble_per * f_mb + br.offload / 2;
  ph.loss += mb * l_mb + bubble_per * l_mb;
  ph.backward += mb * b_mb + bubble_per * b_mb + br.offload / 2;
  ph.optimizer += br.optimizer + br.step_overhead;
  out.model_flops_per_step = d.model_flops_per_step;
  const double peak = gemm_peak_flops(hw, p.precision);
  out.tflops_per_gpu = out.model_flops_per_step / out.step_seconds / p.gpus / 1e12;
  out.mfu = out.tflops_per_gpu * 1e12 / peak;
  out.tokens_per_second_per_gpu = tokens_per_second_per_gpu(d, out.step_seconds);

  // The bottleneck is the largest overhead beyond the model's own compute and the recompute the plan chose:
  // what a different layout could win back.
  const std::pair<const char*, double> terms[] = {
      {"exposed_comm.tp", br.exposed_comm.tp},
      {"exposed_comm.cp", br.exposed_comm.cp}, {"exposed_comm.ep", br.exposed_comm.ep}, {"exposed_comm.pp", br.exposed_comm.pp},
      {"exposed_comm.dp_fsdp", br.exposed_comm.dp_fsdp}, {"bubble", br.bubble}, {"launch_overhead", br.launch_overhead},
      {"optimizer", br.optimizer}, {"offload", br.offload}, {"step_overhead", br.step_overhead}};
  const auto* top = std::max_element(std::begin(terms), std::end(terms),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  out.bottleneck = top->first;
  return out;
}

}  // namespace lcplan
