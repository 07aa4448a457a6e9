#include "estimator/time_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "estimator/flops.h"
#include "estimator/memory_model.h"
#include "parallel/pipeline_split.h"
#include "parallel/chunk_schedule.h"
#include "models/params.h"

namespace lcplan {

namespace {

constexpr double kBf16 = 2;  // bytes per bf16 element
constexpr double kFp32 = 4;  // bytes per fp32 element

}  // namespace

const char* to_string(LinkTier t) { return t == LinkTier::NVLink ? "nvlink" : "network"; }

double efficiency_curve(double max, double half, double x) {
  // Saturating efficiency by op size (Calculon / SimuMax efficiency-by-shape, field-notes "Modelling time").
  return x <= 0 ? 0 : max * x / (x + half);
}

LinkTier group_tier(const RankLayout& l, Group g, int gpus_per_node) {
  return group_nodes(l, g, gpus_per_node) == 1 ? LinkTier::NVLink : LinkTier::Network;
}

double collective_seconds(Collective c, double bytes, int n, LinkTier tier, int nodes, const Hardware& hw,
                          const Calibration& cal) {
  if (n <= 1 || bytes <= 0) return 0;
  const bool net = tier == LinkTier::Network;
  const double alpha = net ? cal.network_latency : cal.nvlink_latency;
  const double ring_bw = net ? hw.network_bandwidth * cal.network_efficiency : hw.nvlink_bandwidth * cal.nvlink_efficiency;
  const double frac = double(n - 1) / n;
  switch (c) {
    case Collective::AllReduce: return alpha + bytes * 2 * frac / ring_bw;  // nccl-tests busbw factor 2(n-1)/n
    case Collective::AllGather:
    case Collective::ReduceScatter: return alpha + bytes * frac / ring_bw;  // nccl-tests busbw factor (n-1)/n
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

namespace {

// Everything per plan that every layer needs, computed once.
struct Ctx {
  const ModelSpec& m;
  const Plan& p;
  const Hardware& hw;
  const Calibration& c;
  double seq = 0;       // tokens per sequence
  double S = 0;         // tokens of this rank's CP shard per microbatch (GEMM M after the SP all-gather)
  double S_hid = 0;     // tokens of hidden-sized tensors on this rank (S / tp under sequence parallelism)
  double tok_frac = 0;  // this rank's share of one sequence's token work before TP: micro_batch / cp
  double tp = 1, cp = 1, ep = 1, etp = 1;
  bool sp = false;
  double gemm_peak = 0;  // peak of the plan's precision for GEMMs (FP8 applies to GEMMs only)
  double gemm_scale = 1; // fp8 efficiency ratio
  double grouped_scale = 1;  // fp8 efficiency ratio of grouped expert GEMMs
  RankLayout layout;
  int gpn = 8;
  LinkTier t_tp{}, t_cp{}, t_ep{}, t_pp{}, t_dpcp{}, t_edp{};
  int n_ep = 1, n_pp = 1, n_dpcp = 1, n_edp = 1, n_cp = 1;  // nodes spanned

  Ctx(const ModelSpec& m_, const Plan& p_, const Hardware& hw_, const Calibration& c_) : m(m_), p(p_), hw(hw_), c(c_) {
    const Parallel& q = p.parallel;
    tp = q.tp;
    cp = q.cp;
    ep = q.ep;
    etp = q.etp;
    seq = double(p.seq_len);
    S = seq * p.micro_batch / cp;
    sp = p.sequence_parallel && q.tp > 1;
    S_hid = sp ? S / tp : S;
    tok_frac = double(p.micro_batch) / cp;
    const bool fp8 = p.precision == Precision::FP8 && hw.peak_fp8_flops > hw.peak_bf16_flops;
    gemm_peak = fp8 ? hw.peak_fp8_flops : hw.peak_bf16_flops;
    gemm_scale = fp8 ? c.fp8_gemm_efficiency_ratio : 1.0;
    grouped_scale = fp8 ? c.fp8_grouped_gemm_efficiency_ratio : 1.0;
    gpn = p.gpus_per_node > 0 ? p.gpus_per_node : hw.gpus_per_node;
    layout = make_rank_layout(p.gpus, q.tp, q.pp, q.cp, q.ep, q.etp);
    auto tier = [&](Group g, int& nodes) {
      nodes = group_nodes(layout, g, gpn);
      return nodes == 1 ? LinkTier::NVLink : LinkTier::Network;
    };
    int dummy = 1;
    t_tp = tier(Group::TP, dummy);
    t_cp = tier(Group::CP, n_cp);
    t_ep = tier(Group::EP, n_ep);
    t_pp = tier(Group::PP, n_pp);
    t_dpcp = tier(Group::DP_CP, n_dpcp);
    t_edp = tier(Group::EDP, n_edp);
  }

  double gemm(double flops, double tokens) const {
    return flops / (gemm_peak * gemm_scale * efficiency_curve(c.gemm_efficiency, c.gemm_half_tokens, tokens));
  }
  double grouped(double flops, double tokens_per_expert) const {
    return flops /
           (gemm_peak * grouped_scale * efficiency_curve(c.grouped_gemm_efficiency, c.grouped_gemm_half_tokens, tokens_per_expert));
  }
  double attention(double flops, double local_seq) const {
    return flops / (hw.peak_bf16_flops * efficiency_curve(c.attention_efficiency, c.attention_half_seq, local_seq));
  }
  double linear(double flops) const { return flops / (hw.peak_bf16_flops * c.linear_attention_efficiency); }
  double memory(double bytes) const { return bytes / (hw.hbm_bandwidth * c.hbm_efficiency); }
  double coll(Collective k, double bytes, int n, LinkTier t, int nodes) const {
    return collective_seconds(k, bytes, n, t, nodes, hw, c);
  }
};

// Per-microbatch cost of one layer on one rank, split the way the breakdown reports it (seconds).
struct Cost {
  double compute = 0;    // forward + backward GPU compute (with interference slowdown)
  double recompute = 0;  // extra forward compute of a recomputed layer
  double tp = 0, cp = 0, ep = 0;  // exposed communication
  double launch = 0;     // launch-floor excess
  double fwd = 0, bwd = 0;  // compute of forward / backward alone (for DP/FSDP overlap)
  void add(const Cost& o, double w = 1) {
    compute += w * o.compute;
    recompute += w * o.recompute;
    tp += w * o.tp;
    cp += w * o.cp;
    ep += w * o.ep;
    launch += w * o.launch;
    fwd += w * o.fwd;
    bwd += w * o.bwd;
  }
  double total() const { return compute + recompute + tp + cp + ep + launch; }
};

// The executor's chunk schedules (parallel/chunk_schedule.h), built once: index 2*(chunks-1) + shared_expert.
const moe::ChunkSchedule& schedule_for(int chunks, bool shared_expert) {
  static const std::array<moe::ChunkSchedule, 2 * moe::kMaxChunks> table = [] {
    std::array<moe::ChunkSchedule, 2 * moe::kMaxChunks> t;
    for (int n = 1; n <= moe::kMaxChunks; ++n)
      for (int s = 0; s < 2; ++s) t[2 * (n - 1) + s] = moe::make_chunk_schedule(n, {}, s == 1);
    return t;
  }();
  return table[2 * (chunks - 1) + (shared_expert ? 1 : 0)];
}

// Span of one pass (forward or backward) of the schedule: both streams in order, each step waiting for its
// dependencies (article section 2.4). Compute steps are held to the launch floor of their kernels.
struct PassTime {
  double span = 0;     // makespan, seconds
  double busy = 0;     // compute-stream time, launch floor included
  double comm = 0;     // communication-stream time
  double launch = 0;   // launch-floor excess over the GPU time
};
template <class Duration>
PassTime cost_pass(const std::vector<moe::Step>& steps, Duration duration_of) {
  std::array<double, 64> end{};  // schedules have at most 2 + 5*kMaxChunks + 2 steps per pass
  double free_at[2] = {0, 0};
  PassTime t;
  for (size_t i = 0; i < steps.size(); ++i) {  // list order is each stream's issue order and respects dependencies
    const moe::Step& st = steps[i];
    const int s = st.stream == moe::StreamKind::Comm ? 0 : 1;
    double ready = free_at[s];
    for (int d : st.deps) ready = std::max(ready, end[d]);
    const auto [gpu, floor] = duration_of(st);
    const double d = std::max(gpu, floor);
    end[i] = free_at[s] = ready + d;
    if (s == 0) t.comm += d;
    else t.busy += d, t.launch += d - gpu;
    t.span = std::max(t.span, end[i]);
  }
  return t;
}

MoeLayerTime moe_time(const Ctx& x) {
  const ModelSpec& m = x.m;
  const Calibration& c = x.c;
  const MoeSpec& e = m.moe;
  const double h = m.hidden;
  const int n = x.p.moe.ep_chunks;
  LayerSpec l;
  l.ffn = FfnKind::MoE;
  const double cf = x.p.moe.capacity_factor;
  const LayerFlops lf = layer_forward_flops(m, l, x.seq, cf);
  // Busiest rank's share (routing imbalance); token dropping pads each expert to capacity instead.
  const double f = cf > 0 ? 1.0 : x.p.moe.routing_imbalance;
  const double sp_tp = x.sp ? x.tp : 1.0;
  const double copies = x.S_hid * x.etp * e.top_k * (cf > 0 ? cf : 1.0) * f;  // routed token copies on this rank
  const double tpe = copies * x.ep / std::max(1, e.num_experts);             // tokens per local expert

  // Router (SP-local tokens, full weights) and shared experts (TP-sharded, gathered tokens): plain GEMMs.
  const double router = x.gemm(lf.router * x.tok_frac / sp_tp, x.S_hid);
  const double shared = lf.shared > 0 ? x.gemm(lf.shared * x.tok_frac / x.tp, x.S) : 0;
  const double routed = x.grouped(lf.routed * x.tok_frac / sp_tp * f, tpe / n) * n;  // n smaller GEMMs
  // Permutation before dispatch and weighted unpermutation after combine: memory-bound passes over the copies.
  const double permute = x.memory(c.moe_permute_passes * copies * h * kBf16) / 2;
  // Per chunk: one all-to-all call, its fixed cost (DeepEP-style launch and layout, FSMoE's alpha) plus bytes.
  // Per layer forward, dropless routing needs the token counts on the host to size its buffers (a count exchange +
  // device-to-host sync, field-notes "Chunked expert-parallel overlap"); token dropping pads every expert to
  // capacity, so its shapes are static and it skips the sync.
  const double a2a =
      x.ep > 1 ? c.a2a_latency + x.coll(Collective::AllToAll, copies / n * h * kBf16, int(x.ep), x.t_ep, x.n_ep) : 0;
  const double sync = cf > 0 ? 0 : c.moe_sync_seconds;
  const double floor = c.kernels_per_moe_chunk * c.launch_seconds;  // kernels of one chunk's expert step
  // Without chunking the expert backward runs dgrad and wgrad back to back (no delayed wgrad, Megatron's default).
  const bool delayed_wgrad = n > 1;
  const moe::ChunkSchedule& sched = schedule_for(n, shared > 0);
  using moe::StepOp;
  const PassTime fw = cost_pass(sched.forward, [&](const moe::Step& st) -> std::pair<double, double> {
    switch (st.op) {
      case StepOp::Route: return {router, 0};
      case StepOp::Counts: return {sync, 0};
      case StepOp::Permute: case StepOp::Unpermute: return {permute / n, 0};
      case StepOp::Dispatch: case StepOp::Combine: return {a2a, 0};
      case StepOp::SharedFwd: return {shared, 0};
      case StepOp::ExpertFwd: return {routed / n, floor};
      default: return {0, 0};
    }
  });
  const PassTime bw = cost_pass(sched.backward, [&](const moe::Step& st) -> std::pair<double, double> {
    switch (st.op) {
      case StepOp::UnpermuteBwd: case StepOp::PermuteBwd: return {2 * permute / n, 0};
      case StepOp::CombineBwd: case StepOp::DispatchBwd: return {a2a, 0};
      case StepOp::SharedBwd: return {2 * shared, 0};
      case StepOp::ExpertDgrad: return {(delayed_wgrad ? 1 : 2) * routed / n, 2 * floor};
      case StepOp::ExpertWgrad: return {delayed_wgrad ? routed : 0, 0};
      case StepOp::RouterBwd: return {2 * router, 0};
      default: return {0, 0};
    }
  });
  MoeLayerTime t;
  // Exposed communication: the span beyond the compute stream's own work; the rest of the traffic ran beside
  // compute and slows it (interference, Mist EuroSys'25).
  t.exposed_comm_forward = std::max(0.0, fw.span - fw.busy);  // rounding can leave -1e-14
  t.exposed_comm_backward = std::max(0.0, bw.span - bw.busy);
  t.launch_forward = fw.launch;
  t.launch_backward = bw.launch;
  t.forward = fw.span + c.interference * std::max(0.0, fw.comm - t.exposed_comm_forward);
  t.backward = bw.span + c.interference * std::max(0.0, bw.comm - t.exposed_comm_backward);
  return t;
}

// One decoder layer (or MTP layer body) for one microbatch on this rank.
Cost layer_cost(const Ctx& x, const LayerSpec& l, bool recomputed, const MoeLayerTime& moe) {
  const ModelSpec& m = x.m;
  const Calibration& c = x.c;
  const double h = m.hidden;
  const LayerFlops lf = layer_forward_flops(m, l, x.seq);
  Cost k;
  double f = 0, b = 0;  // non-MoE forward / backward GPU compute
  f += x.gemm(lf.proj * x.tok_frac / x.tp, x.S);
  double core_f = 0, core_b = 0;
  if (lf.attn_core > 0) {
    core_f = x.attention(lf.attn_core * x.tok_frac / x.tp, x.S);
    core_b = 2.5 * core_f;  // flash attention backward runs 5 matmuls to the forward's 2 (FlashAttention-2 paper)
  } else if (lf.linear_core > 0) {
    core_f = x.linear(lf.linear_core * x.tok_frac / x.tp);
    core_b = 2 * core_f;
  }
  if (lf.dense_mlp > 0) f += x.gemm(lf.dense_mlp * x.tok_frac / x.tp, x.S);
  f += x.memory(c.elementwise_passes * x.S_hid * h * kBf16);
  b = 2 * f + core_b;  // backward = dgrad + wgrad for GEMMs, 2x for elementwise
  f += core_f;

  // TP: Megatron SP all-gather before and reduce-scatter after each TP block (or all-reduce without SP),
  // forward and backward alike (Korthikanti et al. 2022 section 4.2.2). MoE without shared experts has no TP block.
  double tp_f = 0;
  if (x.tp > 1) {
    const int blocks = 1 + (l.ffn == FfnKind::Dense || m.moe.shared_experts > 0 ? 1 : 0);
    const double bytes = x.S * h * kBf16;
    const int t = int(x.tp);
    tp_f = blocks * (x.sp ? x.coll(Collective::AllGather, bytes, t, x.t_tp, 1) + x.coll(Collective::ReduceScatter, bytes, t, x.t_tp, 1)
                          : x.coll(Collective::AllReduce, bytes, t, x.t_tp, 1));
  }
  const double tp_hidden = c.tp_overlap * tp_f;
  const double tp_exposed = tp_f - tp_hidden;

  // CP: full attention / MLA exchange K/V (ring, hidden under attention); gated DeltaNet uses head-parallel
  // all-to-all before and after the delta rule (field-notes "Hybrid linear attention and CP"), not hidden.
  double cp_exp_f = 0, cp_exp_b = 0, cp_hidden = 0;
  if (x.cp > 1) {
    const int n = int(x.cp);
    if (l.mixer == MixerKind::FullAttention || l.mixer == MixerKind::MLA) {
      double kv_dim = 0;
      if (l.mixer == MixerKind::FullAttention) kv_dim = 2.0 * m.attn.kv_heads * m.attn.head_dim;
      else kv_dim = double(m.mla.heads) * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim);
      const double gathered = x.S * x.cp * kv_dim / x.tp * kBf16;  // whole-sequence K and V of this TP rank
      const double comm_f = x.coll(Collective::AllGather, gathered, n, x.t_cp, x.n_cp);
      const double comm_b = comm_f + x.coll(Collective::ReduceScatter, gathered, n, x.t_cp, x.n_cp);  // + dK/dV
      cp_exp_f = std::max(0.0, comm_f - core_f);
      cp_exp_b = std::max(0.0, comm_b - core_b);
      cp_hidden = (comm_f - cp_exp_f) + (comm_b - cp_exp_b);
    } else if (l.mixer == MixerKind::LinearAttention) {
      const LinearAttentionSpec& g = m.linear;
      const double kd = double(g.key_heads) * g.key_head_dim, vd = double(g.value_heads) * g.value_head_dim;
      const double a2a = x.coll(Collective::AllToAll, x.S * (2 * kd + vd) / x.tp * kBf16, n, x.t_cp, x.n_cp) +
                         x.coll(Collective::AllToAll, x.S * vd / x.tp * kBf16, n, x.t_cp, x.n_cp);
      cp_exp_f = a2a;
      cp_exp_b = a2a;
    }
  }

  // Launch floor: a layer cannot run faster than its kernels can be launched.
  const double floor_f = c.kernels_per_layer * c.launch_seconds;
  const double launch_f = std::max(0.0, floor_f - f), launch_b = std::max(0.0, 2 * floor_f - b);
  const double interf = c.interference * (tp_hidden + cp_hidden);

  const bool moe_layer = l.ffn == FfnKind::MoE;
  const double moe_f = moe_layer ? moe.forward - moe.exposed_comm_forward - moe.launch_forward : 0;
  const double moe_b = moe_layer ? moe.backward - moe.exposed_comm_backward - moe.launch_backward : 0;
  k.fwd = f + moe_f;
  k.bwd = b + moe_b;
  k.compute = k.fwd + k.bwd + interf;
  k.tp = 2 * tp_exposed;
  k.cp = cp_exp_f + cp_exp_b;
  // Cross-microbatch all-to-all overlap (Megatron --overlap-moe-expert-parallel-comm) hides a further share.
  // It pairs one microbatch's forward with another's backward, which full recompute does not support (article
  // section 2.4: the reason chunked EP exists), so recomputed layers get none of it.
  const double ep_overlap = recomputed ? 0.0 : c.ep_overlap;
  const double ep_keep = 1 - ep_overlap;
  k.ep = moe_layer ? ep_keep * (moe.exposed_comm_forward + moe.exposed_comm_backward) : 0;
  const double ep_hidden = moe_layer ? ep_overlap * (moe.exposed_comm_forward + moe.exposed_comm_backward) : 0;
  k.compute += c.interference * ep_hidden;
  k.launch = launch_f + launch_b + (moe_layer ? moe.launch_forward + moe.launch_backward : 0);
  if (recomputed) {
    // Full recompute replays the forward, its collectives and its all-to-alls (x2 EP traffic).
    k.recompute = k.fwd;
    k.tp += tp_exposed;
    k.cp += cp_exp_f;
    k.ep += moe_layer ? ep_keep * moe.exposed_comm_forward : 0;
    k.launch += launch_f + (moe_layer ? moe.launch_forward : 0);
  } else if (x.p.recompute == Recompute::Selective) {
    k.recompute = core_f;  // selective recompute replays core attention (Korthikanti et al. 2022)
  }
  return k;
}

// LM head + loss on the last stage for one microbatch (forward + backward): GEMMs plus the fp32 logits' memory
// traffic; linear CE streams the vocabulary and is slower by the calibrated factor (article section 2.3).
Cost loss_cost(const Ctx& x) {
  const ModelSpec& m = x.m;
  Cost k;
  const double head = x.gemm(lm_head_forward_flops(m, x.seq) * x.tok_frac / x.tp, x.S);
  const double logits = x.S * double(m.vocab) / x.tp;
  const double elementwise = x.memory(4 * logits * kFp32);  // write logits, softmax read, grad write, grad read
  double t = 3 * head + elementwise;
  if (x.p.linear_ce) t *= x.c.linear_ce_slowdown;
  k.fwd = t / 3;
  k.bwd = t - k.fwd;
  k.compute = t;
  if (x.tp > 1) {
    const double bytes = x.S * m.hidden * kBf16;
    k.tp = x.coll(Collective::AllGather, bytes, int(x.tp), x.t_tp, 1) + x.coll(Collective::ReduceScatter, bytes, int(x.tp), x.t_tp, 1);
  }
  return k;
}

}  // namespace

MoeLayerTime moe_layer_time(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  return moe_time(Ctx(m, p, hw, cal));
}

TimeEstimate estimate_time(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  const Ctx x(m, p, hw, cal);
  const Parallel& q = p.parallel;
  const PipelineSplit split = split_layers(int(m.layers.size()), q.pp, q.vpp).value();
  const bool full = p.recompute == Recompute::Full;
  const bool has_moe = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
  const MoeLayerTime moe = has_moe ? moe_time(x) : MoeLayerTime{};

  // Layers of one kind cost the same everywhere: cache (kind, recomputed) costs.
  struct Kind {
    LayerSpec spec;
    Cost cost[2];
  };
  std::vector<Kind> kinds;
  auto cost_of = [&](const LayerSpec& l, bool rec) -> const Cost& {
    for (Kind& k : kinds)
      if (k.spec.mixer == l.mixer && k.spec.ffn == l.ffn && k.spec.sliding == l.sliding) return k.cost[rec];
    kinds.push_back({l, {layer_cost(x, l, false, moe), layer_cost(x, l, true, moe)}});
    return kinds.back().cost[rec];
  };

  // Per-microbatch time of each stage; the slowest stage is the pipeline's clock.
  std::vector<Cost> stage(q.pp);
  for (int i = 0; i < int(m.layers.size()); ++i) {
    const int r = split.stage_of(i);  // Megatron interleaved assignment: chunk c -> stage c % pp
    const bool rec = full && (p.recompute_layers == 0 || split.pos_in_chunk(i) < p.recompute_layers);
    stage[r].add(cost_of(m.layers[i], rec));
  }
  Cost& last = stage[q.pp - 1];
  const Cost loss = loss_cost(x);
  last.add(loss);
  if (m.mtp_layers > 0 && !m.layers.empty()) {
    LayerSpec mtp = m.layers.back();
    mtp.sliding = false;
    Cost body = cost_of(mtp, full);
    const double eh = x.gemm(2.0 * (2.0 * m.hidden) * m.hidden * x.S / x.tp, x.S);  // eh_proj
    body.compute += 3 * eh;
    body.fwd += eh;
    body.bwd += 2 * eh;
    if (full) body.recompute += eh;
    last.add(body, m.mtp_layers);
    last.add(loss, m.mtp_layers);  // each MTP module has its own LM head and loss
  }
  int clock = 0;
  for (int r = 1; r < q.pp; ++r)
    if (stage[r].total() > stage[clock].total()) clock = r;
  const Cost& c = stage[clock];

  // PP: activations forward and gradients backward at every virtual-chunk boundary: on the critical path of plain
  // 1F1B; the interleaved schedule overlaps them with compute (Megatron-LM overlap_p2p_comm, on with vpp > 1).
  double pp_mb = 0;
  if (q.pp > 1 && q.vpp == 1)
    pp_mb = 2.0 * q.vpp * x.coll(Collective::SendRecv, x.S_hid * m.hidden * kBf16, 2, x.t_pp, x.n_pp);

  const double mb = std::max(1, num_microbatches(p));
  const double t_mb = c.total() + pp_mb;

  TimeEstimate out;
  TimeBreakdown& br = out.breakdown;
  br.compute = mb * c.compute;
  br.recompute = mb * c.recompute;
  br.launch_overhead = mb * c.launch;
  br.exposed_comm.tp = mb * c.tp;
  br.exposed_comm.cp = mb * c.cp;
  br.exposed_comm.ep = mb * c.ep;
  br.exposed_comm.pp = mb * pp_mb;
  // Bubble (p-1)/(m*v) of the m microbatches' time (Narayanan et al. 2021, arXiv 2104.04473, section 2.2).
  br.bubble = double(q.pp - 1) / q.vpp * t_mb;

  // DP / FSDP: gradient reduce-scatter (or all-reduce) and parameter all-gather, overlapped with compute.
  // Parameters on the clock stage's GPU (after TP and EP sharding), one pass over the layers.
  double dense = 0, expert = 0;
  {
    std::vector<double> sd(q.pp, 0), se(q.pp, 0);
    LayerSpec prev{};
    LayerParams lp;
    bool have = false;
    for (int i = 0; i < int(m.layers.size()); ++i) {
      const LayerSpec& l = m.layers[i];
      if (!have || l.mixer != prev.mixer || l.ffn != prev.ffn) lp = layer_params(m, l), prev = l, have = true;
      const int r = split.stage_of(i);
      sd[r] += (lp.mixer + lp.dense_mlp + lp.shared_experts) / q.tp + lp.mixer_replicated + lp.router + lp.norms;
      se[r] += lp.routed_experts / (double(q.ep) * q.etp);
    }
    const double table = double(m.vocab) * m.hidden / q.tp;  // vocab-parallel embedding / LM head
    sd[0] += table;
    if (!m.tied_embeddings || q.pp > 1) sd[q.pp - 1] += table;
    dense = sd[clock];
    expert = se[clock];
  }
  const int n_dpcp = x.layout.dp * x.layout.cp, n_edp = x.layout.edp;
  const double gb = cal.main_grad_bytes;
  const auto reduce = p.optimizer_sharding == OptimizerSharding::None ? Collective::AllReduce : Collective::ReduceScatter;
  const double grad_sync = x.coll(reduce, dense * gb, n_dpcp, x.t_dpcp, x.n_dpcp) +
                           x.coll(reduce, expert * gb, n_edp, x.t_edp, x.n_edp);
  const double param_gather = x.coll(Collective::AllGather, dense * kBf16, n_dpcp, x.t_dpcp, x.n_dpcp) +
                              x.coll(Collective::AllGather, expert * kBf16, n_edp, x.t_edp, x.n_edp);
  double dp_exposed = 0, dp_hidden = 0;
  if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
    // FSDP (ZeRO-3): every microbatch gathers parameters for forward and again for backward (reshard after
    // forward) and reduce-scatters gradients, prefetched under that microbatch's compute.
    const double comm = 2 * param_gather + grad_sync;
    const double cover = cal.dp_overlap * (c.fwd + c.bwd + c.recompute);
    dp_exposed = mb * std::max(0.0, comm - cover);
    dp_hidden = mb * std::min(comm, cover);
  } else {
    // Megatron overlaps the grad reduce with the last microbatch's backward and the distributed optimizer's
    // parameter all-gather with the first microbatch's forward (--overlap-grad-reduce / --overlap-param-gather).
    const double ag = p.optimizer_sharding == OptimizerSharding::DistOpt ? param_gather : 0;
    const double cover_b = cal.dist_opt_overlap * cal.dp_overlap * c.bwd, cover_f = cal.dist_opt_overlap * cal.dp_overlap * c.fwd;
    dp_exposed = std::max(0.0, grad_sync - cover_b) + std::max(0.0, ag - cover_f);
    dp_hidden = std::min(grad_sync, cover_b) + std::min(ag, cover_f);
  }
  br.exposed_comm.dp_fsdp = dp_exposed;
  br.compute += cal.interference * dp_hidden;

  // Optimizer step: memory-bound Adam over this rank's optimizer shard.
  const double shard = p.optimizer_sharding == OptimizerSharding::None
                           ? dense + expert
                           : dense / std::max(1, n_dpcp) + expert / std::max(1, n_edp);
  if (p.offload.optimizer) {
    // Offloaded Adam (ZeRO-Offload, arXiv 2101.06840): fp32 gradients down, bf16 parameters up the host link,
    // the update on the CPU; neither overlaps the step's compute.
    const double host_bw = hw.host_bandwidth * cal.host_link_efficiency;
    br.optimizer = shard * (cal.main_grad_bytes + kBf16) / host_bw + shard / cal.cpu_adam_params_per_second;
  } else {
    br.optimizer = x.memory(cal.optimizer_bytes_per_param * shard);
  }
  if (p.offload.activations) {
    // Saved activations go to the host after each layer's forward and come back for its backward; the copy engines
    // run beside compute, so only what exceeds the overlappable share of the stage's compute is exposed.
    double saved = 0;
    for (int i = 0; i < int(m.layers.size()); ++i)
      if (split.stage_of(i) == clock) saved += layer_activation(m, p, m.layers[i], full).saved;
    const double copy = 2 * saved / (hw.host_bandwidth * cal.host_link_efficiency);
    br.offload = mb * std::max(0.0, copy - cal.dp_overlap * (c.fwd + c.bwd + c.recompute));
  }

  out.step_seconds = br.compute + br.recompute + br.exposed_comm.total() + br.bubble + br.launch_overhead + br.optimizer +
                     br.offload;
  out.model_flops_per_step = model_flops_per_step(m, p);
  const double peak = p.precision == Precision::FP8 ? hw.peak_fp8_flops : hw.peak_bf16_flops;
  out.tflops_per_gpu = out.model_flops_per_step / out.step_seconds / p.gpus / 1e12;
  out.mfu = out.tflops_per_gpu * 1e12 / peak;
  out.tokens_per_second_per_gpu = double(effective_global_batch(p)) * p.seq_len / out.step_seconds / p.gpus;

  // The bottleneck is the largest overhead beyond the model's own compute and the recompute the plan chose:
  // what a different layout could win back.
  const std::pair<const char*, double> terms[] = {
      {"exposed_comm.tp", br.exposed_comm.tp},
      {"exposed_comm.cp", br.exposed_comm.cp}, {"exposed_comm.ep", br.exposed_comm.ep}, {"exposed_comm.pp", br.exposed_comm.pp},
      {"exposed_comm.dp_fsdp", br.exposed_comm.dp_fsdp}, {"bubble", br.bubble}, {"launch_overhead", br.launch_overhead},
      {"optimizer", br.optimizer}, {"offload", br.offload}};
  const auto* top = std::max_element(std::begin(terms), std::end(terms),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  out.bottleneck = top->first;
  return out;
}

}  // namespace lcplan
