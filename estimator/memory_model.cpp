#include "estimator/memory_model.h"

#include <algorithm>
#include <cmath>

#include "estimator/run_physics.h"
#include "parallel/pipeline_split.h"
#include "models/params.h"

namespace lcplan {

const char* to_string(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Loss: return "loss";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "?";
}

namespace {

constexpr double kBf16 = 2;        // bytes of a bf16 element
constexpr double kFp32 = 4;        // bytes of an fp32 element

// Weights, main gradients and optimizer state of one stage after sharding, plus the fixed workspace and context.
MemoryBreakdown static_terms(const DerivedPlan& d, const StageRecord& sr, const Calibration& cal) {
  const Plan& p = *d.plan;
  const UnitParams& sp = sr.params;
  const double dense_shard = double(d.dp) * p.parallel.cp;  // ranks sharing the same dense parameters (dist-opt group)
  const double edp = d.edp;                                  // expert data parallel size
  // Dist-opt instances shard the state over DP / instances, one copy per instance (megatron-settings.md section 1).
  const double instances = p.optimizer_sharding == OptimizerSharding::DistOpt ? std::max(1, p.optimizer.instances) : 1;
  const double grad_b = grad_bytes_per_param(p);
  const double param_b = param_bytes_per_param(p, cal);
  const double adam_b = optimizer_state_bytes_per_param(p);
  MemoryBreakdown stat;
  switch (p.optimizer_sharding) {
    case OptimizerSharding::None:
      stat.params = param_b * (sp.dense + sp.expert);
      stat.grads = grad_b * (sp.dense + sp.expert);
      stat.optimizer = adam_b * (sp.dense + sp.expert);
      break;
    case OptimizerSharding::DistOpt:  // ZeRO-1: optimizer sharded over DP*CP (dense) and expert-DP (experts)
      stat.params = param_b * (sp.dense + sp.expert);
      stat.grads = grad_b * (sp.dense + sp.expert);
      stat.optimizer = adam_b * instances * (sp.dense / dense_shard + sp.expert / edp);
      break;
    case OptimizerSharding::Fsdp: {  // ZeRO-3: everything sharded over the same groups
      const double shard = sp.dense / dense_shard + sp.expert / edp;
      stat.params = param_b * shard;
      stat.grads = grad_b * shard;
      stat.optimizer = adam_b * shard;
      break;
    }
  }
  // Offloaded optimizer state lives on the host: the offloaded fraction of it (Megatron --optimizer-offload-fraction).
  if (p.offload.optimizer) stat.optimizer *= 1 - p.offload.optimizer_fraction;
  // NCCL allocates buffers per communicator this rank belongs to; dispatchers, TP overlap and CUDA graphs add theirs.
  stat.workspace = cal.workspace_bytes + cal.nccl_bytes_per_group * d.communicators + run_settings_workspace(d, sr, cal);
  stat.cuda_context = cal.cuda_context_bytes;
  return stat;
}

// Phase `ph`'s breakdown: the static terms of `stat` and the dynamic terms the phase holds (README "What each number
// means"); the only place that says which phase holds what.
MemoryBreakdown compose(const MemoryBreakdown& stat, const PhaseTerms& t, Phase ph) {
  MemoryBreakdown b = stat;
  b.activations = ph == Phase::Optimizer ? 0 : t.saved_activations;
  b.logits = b.moe_buffers = b.fsdp_buffers = 0;
  switch (ph) {
    case Phase::Forward:
      b.moe_buffers = t.moe_buffers;
      b.fsdp_buffers = t.fsdp_gather;
      break;
    case Phase::Loss:
      b.logits = t.logits;
      b.fsdp_buffers = t.fsdp_gather;
      break;
    case Phase::Backward:
      b.activations += t.rebuilt;
      b.moe_buffers = t.moe_buffers;
      b.fsdp_buffers = t.fsdp_gather + t.fsdp_grad;
      break;
    case Phase::Optimizer:
      break;
  }
  b.fragmentation = t.fragmentation * (b.activations + b.logits + b.moe_buffers + b.fsdp_buffers);
  return b;
}

}  // namespace

MemoryBreakdown StageMemory::phase(Phase p) const {
  if (p == Phase::Loss && !has_loss) return {};
  return compose(breakdown, terms, p);
}

MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  return estimate_memory(derive_plan(m, p, hw), cal);
}

StageMemory stage_memory(const DerivedPlan& d, const Calibration& cal, int r) {
  const ModelSpec& m = *d.model;
  const Plan& p = *d.plan;
  const Parallel& q = p.parallel;
  const int n_chunks = d.moe_chunks;
  // With n chunks one chunk's MoE buffers are live, plus the overlapped neighbour's share (article section 2.4).
  const double chunk_factor = n_chunks == 1 ? 1.0 : std::min(1.0, (1.0 + cal.moe_chunk_overlap) / n_chunks);

  // The largest rematerialized layer's extra working set, and the largest whole layer, per stage: one look at each
  // (kind, recomputed) pair the stage holds. During its backward a layer is whole on the device: full recompute
  // rebuilds it (chunked EP one chunk of routed tokens at a time; the uniform method a checkpoint's layers at once),
  // selective recompute rebuilds what it dropped, offloaded modules' inputs come back from the host.
  const double group = layers_per_checkpoint(p);
  auto rebuilt = [&](const StageRecord& st, double& working, double& whole) {
    working = whole = 0;
    for (uint64_t bits = st.kinds_present; bits; bits &= bits - 1) {
      const int bit = __builtin_ctzll(bits);
      const bool recomputed = bit & 1;
      const LayerActivation& la = recomputed ? d.kinds[bit / 2].when_recomputed : d.kinds[bit / 2].when_kept;
      const double w = recomputed ? (la.full - la.moe_tokens) + la.moe_tokens * chunk_factor : la.full;
      if (recomputed || la.full > la.saved) working = std::max(working, (recomputed ? group : 1) * w - la.saved);
      whole = std::max(whole, w);
    }
  };
  const double S = d.local_tokens;

  StageMemory st;
  st.stage = r;
  const bool last = r == q.pp - 1;
  const StageRecord& sr = d.stages[r];
  st.layers = sr.layers;
  st.inflight_microbatches = sr.layers > 0 ? sr.inflight_sum / sr.layers : 0;

  // Saved activations of in-flight microbatches, and the largest rematerialized layer's extra working set.
  PhaseTerms t;
  double whole = 0;
  t.saved_activations = sr.saved_activations;
  rebuilt(sr, t.rebuilt, whole);
  if (p.offload.activations) {
    // Saved activations live on the host; the layer being backpropagated comes back whole.
    t.saved_activations = 0;
    t.rebuilt = std::max(t.rebuilt, whole);
  }
  if (sr.has_moe) t.moe_buffers = cal.moe_buffer_copies * kBf16 * d.routed_tokens * routed_width(m) * chunk_factor;
  // The allgather dispatcher gathers the EP group's tokens before its local permutation (Megatron-LM
  // token_dispatcher.py MoEAllGatherTokenDispatcher), and scatters as many back.
  if (sr.has_moe && q.ep > 1 && p.moe.dispatcher == MoeDispatcher::AllGather)
    t.moe_buffers += 2 * kBf16 * d.hidden_tokens * q.ep * routed_width(m);
  // Cross-microbatch EP overlap runs one microbatch's forward inside another's backward (Megatron's combined 1F1B):
  // a layer of the next microbatch is alive beside the one being backpropagated (MPC: it can raise the peak).
  if (sr.has_moe && p.moe.a2a_overlap) t.rebuilt += whole;
  // Loss side (last stage): fp32 logits tokens x vocab/tp (article section 2.3) or linear CE's streaming state.
  if (last) {
    const double vocab_local = double(m.vocab) / q.tp;
    if (p.linear_ce) {
      const double tile = std::min(cal.linear_ce_vocab_tile, vocab_local);
      t.logits = S * tile * kBf16 + S * 4 * kFp32 + S * m.hidden * kFp32;  // tile, per-token stats, fp32 d_hidden
    } else {
      t.logits = S * vocab_local * cal.logits_bytes_per_element;
    }
  }
  if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
    t.fsdp_gather = param_gather_bytes_per_param(p) * (1 + cal.fsdp_prefetch_units) * sr.max_unit;  // current + prefetched
    t.fsdp_grad = grad_bytes_per_param(p) * sr.max_unit;  // unsharded gradient before reduce-scatter
  }
  t.fragmentation = cal.fragmentation;
  st.terms = t;
  st.has_loss = last;
  const MemoryBreakdown stat = static_terms(d, sr, cal);
  // One call per phase, so each composition folds to the terms that phase holds.
  st.peak_bytes = -1;
  auto consider = [&](Phase ph) {
    const double tot = compose(stat, t, ph).total();
    if (tot > st.peak_bytes) {
      st.peak_bytes = tot;
      st.peak_phase = ph;
    }
  };
  consider(Phase::Forward);
  if (last) consider(Phase::Loss);
  consider(Phase::Backward);
  consider(Phase::Optimizer);
  st.breakdown = compose(stat, t, st.peak_phase);
  return st;
}

// The layer's weights and gradients (router, local routed experts, shared experts), what its forward saves (its input
// among them: the pre-FFN norm's output), its output and input gradient, its MoE buffers, and in the backward the
// gradient of the routed fc1 output (the largest tensor the backward makes: [routed copies x 2 ffn] when gated).
double moe_layer_peak_bytes(const DerivedPlan& d, const Calibration& cal) {
  const ModelSpec& m = *d.model;
  const Plan& p = *d.plan;
  for (const LayerKind& k : d.kinds) {
    if (k.spec.ffn != FfnKind::MoE) continue;
    const LayerParams lp = layer_params(m, k.spec);
    const double weights = k.params.expert + lp.router + lp.latent_proj + lp.shared_experts / p.parallel.tp;
    const double io = 2 * kBf16 * d.hidden_tokens * m.hidden;
    const double saved = ffn_activation(m, p, k.spec).saved;
    const double buffers = cal.moe_buffer_copies * kBf16 * d.routed_tokens * routed_width(m);
    const double fc1_grad = kBf16 * d.routed_tokens * (m.gated_mlp ? 2 : 1) * m.moe.expert_ffn / p.parallel.etp;
    return (param_bytes_per_param(p, cal) + grad_bytes_per_param(p)) * weights + io + saved + buffers + fc1_grad;
  }
  return 0;
}

MemoryEstimate estimate_memory(const DerivedPlan& d, const Calibration& cal) {
  MemoryEstimate est;
  est.stages.reserve(d.stages.size());
  for (int r = 0; r < int(d.stages.size()); ++r) {
    const StageMemory& st = est.stages.emplace_back(stage_memory(d, cal, r));
    if (st.peak_bytes > est.peak_bytes) {
      est.peak_bytes = st.peak_bytes;
      est.peak_stage = r;
      est.peak_phase = st.peak_phase;
    }
  }
  return est;
}

}  // namespace lcplan
