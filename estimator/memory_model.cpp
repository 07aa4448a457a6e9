#include "estimator/memory_model.h"

#include <algorithm>
#include <cmath>

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
constexpr double kAdamBytes = 12;  // fp32 master + two fp32 Adam moments (ZeRO paper, arXiv 1910.02054, section 3.1)

}  // namespace

MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  return estimate_memory(derive_plan(m, p, hw), cal);
}

MemoryEstimate estimate_memory(const DerivedPlan& d, const Calibration& cal) {
  const ModelSpec& m = *d.model;
  const Plan& p = *d.plan;
  const Parallel& q = p.parallel;
  const double dense_shard = double(d.dp) * q.cp;  // ranks sharing the same dense parameters (Megatron dist-opt group)
  const double edp = d.edp;                         // expert data parallel size
  const int n_chunks = d.moe_chunks;
  // With n chunks one chunk's MoE buffers are live, plus the overlapped neighbour's share (article section 2.4).
  const double chunk_factor = n_chunks == 1 ? 1.0 : std::min(1.0, (1.0 + cal.moe_chunk_overlap) / n_chunks);
  // NCCL allocates buffers per communicator this rank belongs to.
  const double workspace = cal.workspace_bytes + cal.nccl_bytes_per_group * d.communicators;

  // The largest rematerialized layer's extra working set, and the largest whole layer, per stage: one look at each
  // (kind, recomputed) pair the stage holds. During its backward a layer is whole on the device: full recompute
  // rebuilds it (chunked EP one chunk of routed tokens at a time), selective recompute rebuilds what it dropped.
  auto rebuilt = [&](const StageRecord& st, double& working, double& whole) {
    working = whole = 0;
    for (uint64_t bits = st.kinds_present; bits; bits &= bits - 1) {
      const int bit = __builtin_ctzll(bits);
      const bool recomputed = bit & 1;
      const LayerActivation& la = recomputed ? d.kinds[bit / 2].when_recomputed : d.kinds[bit / 2].when_kept;
      const double w = recomputed ? (la.full - la.moe_tokens) + la.moe_tokens * chunk_factor : la.full;
      if (recomputed || p.recompute == Recompute::Selective) working = std::max(working, w - la.saved);
      whole = std::max(whole, w);
    }
  };
  const double moe_tok = d.routed_tokens;
  const double S = d.local_tokens;

  MemoryEstimate est;
  est.stages.reserve(q.pp);
  for (int r = 0; r < q.pp; ++r) {
    StageMemory st;
    st.stage = r;
    const bool last = r == q.pp - 1;
    const StageRecord& sr = d.stages[r];
    const UnitParams& sp = sr.params;

    MemoryBreakdown stat;
    const double grad_b = cal.main_grad_bytes;
    // bf16 weights, plus the fp8/fp4 copy a low-precision recipe keeps of them (Transformer Engine's weight cache).
    const double param_b = kBf16 + (p.precision == Precision::BF16 ? 0.0 : cal.low_precision_weight_bytes);
    switch (p.optimizer_sharding) {
      case OptimizerSharding::None:
        stat.params = param_b * (sp.dense + sp.expert);
        stat.grads = grad_b * (sp.dense + sp.expert);
        stat.optimizer = kAdamBytes * (sp.dense + sp.expert);
        break;
      case OptimizerSharding::DistOpt:  // ZeRO-1: optimizer sharded over DP*CP (dense) and expert-DP (experts)
        stat.params = param_b * (sp.dense + sp.expert);
        stat.grads = grad_b * (sp.dense + sp.expert);
        stat.optimizer = kAdamBytes * (sp.dense / dense_shard + sp.expert / edp);
        break;
      case OptimizerSharding::Fsdp: {  // ZeRO-3: everything sharded over the same groups
        const double shard = sp.dense / dense_shard + sp.expert / edp;
        stat.params = param_b * shard;
        stat.grads = grad_b * shard;
        stat.optimizer = kAdamBytes * shard;
        break;
      }
    }
    if (p.offload.optimizer) stat.optimizer = 0;

    // Saved activations of in-flight microbatches, and the largest rematerialized layer's extra working set.
    double act = sr.saved_activations, working = 0, whole = 0;
    rebuilt(sr, working, whole);
    st.layers = sr.layers;
    if (p.offload.activations) {
      // Saved activations live on the host; the layer being backpropagated comes back whole.
      act = 0;
      working = std::max(working, whole);
    }
    st.inflight_microbatches = sr.layers > 0 ? sr.inflight_sum / sr.layers : 0;

    const double moe_buf = sr.has_moe ? cal.moe_buffer_copies * kBf16 * moe_tok * m.hidden * chunk_factor : 0;

    // Loss side (last stage): fp32 logits tokens x vocab/tp (article section 2.3) or linear CE's streaming state.
    double logits = 0;
    if (last) {
      const double vocab_local = double(m.vocab) / q.tp;
      if (p.linear_ce) {
        const double tile = std::min(cal.linear_ce_vocab_tile, vocab_local);
        logits = S * tile * kBf16 + S * 4 * kFp32 + S * m.hidden * kFp32;  // tile, per-token stats, fp32 d_hidden
      } else {
        logits = S * vocab_local * cal.logits_bytes_per_element;
      }
    }

    double fsdp_gather = 0, fsdp_grad = 0;
    if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
      fsdp_gather = kBf16 * (1 + cal.fsdp_prefetch_units) * sr.max_unit;  // current + prefetched unit
      fsdp_grad = grad_b * sr.max_unit;                                  // unsharded gradient before reduce-scatter
    }
    auto phase_total = [&](Phase ph) {
      MemoryBreakdown b = stat;
      b.workspace = workspace;
      b.cuda_context = cal.cuda_context_bytes;
      if (ph != Phase::Optimizer) b.activations = act;
      switch (ph) {
        case Phase::Forward:
          b.moe_buffers = moe_buf;
          b.fsdp_buffers = fsdp_gather;
          break;
        case Phase::Loss:
          b.logits = logits;
          b.fsdp_buffers = fsdp_gather;
          break;
        case Phase::Backward:
          b.activations += working;
          b.moe_buffers = moe_buf;
          b.fsdp_buffers = fsdp_gather + fsdp_grad;
          break;
        case Phase::Optimizer:
          break;
      }
      b.fragmentation = cal.fragmentation * (b.activations + b.logits + b.moe_buffers + b.fsdp_buffers);
      return b;
    };
    const Phase phases[] = {Phase::Forward, Phase::Loss, Phase::Backward, Phase::Optimizer};
    st.peak_bytes = -1;
    for (Phase ph : phases) {
      if (ph == Phase::Loss && !last) continue;
      const MemoryBreakdown b = phase_total(ph);
      const double tot = b.total();
      if (tot > st.peak_bytes) {
        st.peak_bytes = tot;
        st.peak_phase = ph;
        st.breakdown = b;
      }
    }
    if (st.peak_bytes > est.peak_bytes) {
      est.peak_bytes = st.peak_bytes;
      est.peak_stage = r;
      est.peak_phase = st.peak_phase;
    }
    est.stages.push_back(st);
  }
  return est;
}

}  // namespace lcplan
