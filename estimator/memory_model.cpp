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

constexpr double kBf16 = 2;      // bytes of a bf16 element
constexpr double kFp32 = 4;      // bytes of an fp32 element
constexpr double kAdamBytes = 12;  // fp32 master + two fp32 Adam moments (ZeRO paper, arXiv 1910.02054, section 3.1)

struct Shape {
  double S;    // tokens of this rank's CP shard: seq * micro_batch / cp
  double hid;  // tokens of hidden-sized tensors on this rank: S / tp under sequence parallelism, else S
  double t;    // tp
};

Shape shape_of(const Plan& p) {
  Shape s;
  s.t = p.parallel.tp;
  s.S = double(p.seq_len) * p.micro_batch / p.parallel.cp;
  s.hid = (p.sequence_parallel && p.parallel.tp > 1) ? s.S / s.t : s.S;
  return s;
}

// Routed token copies this rank's experts process: T*k (EP is carved out of DP, so it does not shrink them;
// field-notes "MoE buffers"), times the busiest rank's imbalance, capped by the capacity factor when dropping.
double routed_tokens(const ModelSpec& m, const Plan& p, const Shape& s) {
  double f = p.moe.routing_imbalance;
  if (p.moe.capacity_factor > 0) f = std::min(f, p.moe.capacity_factor);
  return s.hid * p.parallel.etp * m.moe.top_k * f;
}

// Saved-tensor accounting in bf16, one tensor at a time (after Korthikanti et al. 2022, arXiv 2205.05198,
// section 4, with flash attention so no s^2 term). `sel` marks tensors that selective recompute drops
// (Megatron --recompute-modules core_attn, layernorm, moe_act / mlp act).
struct Acc {
  double kept = 0, dropped = 0, moe = 0;
  void add(double bytes, bool sel = false) { (sel ? dropped : kept) += bytes; }
};

void mixer_acts(const ModelSpec& m, const LayerSpec& l, const Shape& s, Acc& a) {
  const double h = m.hidden;
  a.add(kBf16 * s.hid * h, true);  // pre-mixer norm output (projection input, re-gathered under SP)
  switch (l.mixer) {
    case MixerKind::FullAttention: {
      const AttentionSpec& at = m.attn;
      const double q = at.heads / s.t * at.head_dim, kv = at.kv_heads / s.t * at.head_dim;
      a.add(kBf16 * s.S * (q + 2 * kv));            // q, k, v (flash attention inputs)
      a.add(kBf16 * s.S * q);                       // attention output (o_proj input when ungated)
      a.add(kFp32 * s.S * at.heads / s.t, true);    // softmax log-sum-exp
      if (at.output_gate) a.add(2 * kBf16 * s.S * q);  // gate and gated output (o_proj input)
      break;
    }
    case MixerKind::LinearAttention: {
      const LinearAttentionSpec& g = m.linear;
      const double k = g.key_heads / s.t * g.key_head_dim, v = g.value_heads / s.t * g.value_head_dim;
      const double vh = g.value_heads / s.t;
      a.add(kBf16 * s.S * (2 * k + 2 * v + 2 * vh));  // in_proj outputs q, k, v, z, b, a
      a.add(kBf16 * s.S * (2 * k + v));               // conv1d + SiLU outputs (delta-rule inputs)
      a.add(kFp32 * s.S * 2 * vh);                    // decay g and beta in fp32
      a.add(2 * kBf16 * s.S * v);                     // delta-rule output and gated-norm output (out_proj input)
      break;
    }
    case MixerKind::MLA: {
      const MlaSpec& ml = m.mla;
      const double heads = ml.heads / s.t, qk = double(ml.qk_nope_head_dim) + ml.qk_rope_head_dim;
      if (ml.q_lora_rank > 0) a.add(2 * kBf16 * s.S * ml.q_lora_rank);       // q_a output and its norm
      a.add(kBf16 * s.S * (2.0 * ml.kv_lora_rank + ml.qk_rope_head_dim));    // kv_a output and its norm
      a.add(kBf16 * s.S * heads * (2 * qk + ml.v_head_dim));                  // q, k, v after up-projection
      a.add(kBf16 * s.S * heads * ml.v_head_dim);                             // attention output (o_proj input)
      a.add(kFp32 * s.S * heads, true);                                       // log-sum-exp
      break;
    }
  }
}

// Gated MLP on `tokens` tokens with `ffn` columns on this rank: fc1 output (gate+up) and activation output.
void mlp_acts(const ModelSpec& m, double tokens, double ffn, Acc& a, bool moe_part) {
  const double up = m.gated_mlp ? 2 : 1;
  const double fc1 = kBf16 * tokens * up * ffn, act = kBf16 * tokens * ffn;
  a.add(fc1);
  a.add(act, true);
  if (moe_part) a.moe += fc1 + act;
}

void ffn_acts(const ModelSpec& m, const Plan& p, const LayerSpec& l, const Shape& s, Acc& a) {
  const double h = m.hidden;
  a.add(kBf16 * s.hid * h, true);  // pre-FFN norm output
  if (l.ffn == FfnKind::Dense) {
    mlp_acts(m, s.S, m.dense_ffn / s.t, a, false);
    return;
  }
  const MoeSpec& e = m.moe;
  const double n = routed_tokens(m, p, s);
  a.add(2 * kFp32 * s.hid * e.num_experts);  // router logits and probabilities (fp32)
  a.add(kBf16 * n * h);                      // dispatched tokens (fc1 input)
  a.add(kBf16 * n * h);                      // expert output before combine (needed for the routing-weight gradient)
  a.moe += 2 * kBf16 * n * h;
  mlp_acts(m, n, double(e.expert_ffn) / p.parallel.etp, a, true);
  if (e.shared_experts > 0) mlp_acts(m, s.S, double(e.shared_experts) * e.shared_ffn / s.t, a, false);
}

// Microbatches whose activations virtual chunk j of stage r holds at the stage's peak (1F1B).
// No VPP: pp - r (Korthikanti et al. 2022 section 4.2.3). VPP: mbridge memory_estimator/estimate_013.py.
double inflight(int r, int j, int pp, int vpp, int m) {
  double n;
  if (vpp == 1) n = pp - r;
  else if (j == 0) n = pp + std::max(2 * (pp - r) - 1 - pp, 0);
  else if (j == vpp - 1) n = std::min(2 * (pp - r) + 1, pp);
  else n = pp;
  return std::min<double>(n, std::max(m, 1));
}

}  // namespace

LayerActivation layer_activation(const ModelSpec& m, const Plan& p, const LayerSpec& layer, bool recomputed) {
  const Shape s = shape_of(p);
  Acc a;
  a.add(kBf16 * s.hid * m.hidden);  // layer input: the residual stream (the only tensor full recompute keeps)
  const double input = a.kept;
  mixer_acts(m, layer, s, a);
  ffn_acts(m, p, layer, s, a);
  LayerActivation out;
  out.full = a.kept + a.dropped;
  out.moe_tokens = a.moe;
  if (recomputed) out.saved = input;
  else if (p.recompute == Recompute::Selective) out.saved = a.kept;
  else out.saved = out.full;
  return out;
}

namespace {

// One FSDP unit (a layer) on this GPU: TP-sharded weights / tp + replicated vectors, experts / (ep*etp).
struct UnitParams {
  double dense = 0, expert = 0;
};
UnitParams unit_params(const LayerParams& lp, const Parallel& q) {
  return {(lp.mixer + lp.dense_mlp + lp.shared_experts) / q.tp + lp.mixer_replicated + lp.router + lp.norms,
          lp.routed_experts / (double(q.ep) * q.etp)};
}

// Embedding on the first stage; LM head, final norm and MTP modules on the last (Megatron's placement).
void add_edge_units(const ModelSpec& m, const Parallel& q, int stage, StageParams& sp) {
  auto add_unit = [&](const UnitParams& u) {
    sp.dense += u.dense;
    sp.expert += u.expert;
    sp.max_unit = std::max(sp.max_unit, u.dense + u.expert);
  };
  const double table = double(m.vocab) * m.hidden / q.tp;  // vocab-parallel embedding / LM head
  if (stage == 0) add_unit({table, 0});
  if (stage == q.pp - 1) {
    // Untied models have an LM head; tied ones keep a copy of the embedding on the last stage when pp > 1 (Megatron).
    if (!m.tied_embeddings || q.pp > 1) add_unit({table, 0});
    sp.dense += m.hidden;  // final norm
    if (m.mtp_layers > 0) {
      const UnitParams u = unit_params(mtp_module_params(m), q);
      for (int i = 0; i < m.mtp_layers; ++i) add_unit(u);
    }
  }
}

}  // namespace

StageParams stage_params(const ModelSpec& m, const Plan& p, int stage) {
  const Parallel& q = p.parallel;
  const PipelineSplit lay = split_layers(int(m.layers.size()), q.pp, q.vpp).value();
  StageParams sp;
  for (int i = 0; i < int(m.layers.size()); ++i) {
    if (lay.stage_of(i) != stage) continue;
    const UnitParams u = unit_params(layer_params(m, m.layers[i]), q);
    sp.dense += u.dense;
    sp.expert += u.expert;
    sp.max_unit = std::max(sp.max_unit, u.dense + u.expert);
  }
  add_edge_units(m, q, stage, sp);
  return sp;
}

MemoryEstimate estimate_memory(const ModelSpec& m, const Plan& p, const Calibration& cal) {
  const Parallel& q = p.parallel;
  const Shape s = shape_of(p);
  const int dp = data_parallel(p);
  const int mbs = num_microbatches(p);
  const double dense_shard = double(dp) * q.cp;  // ranks sharing the same dense parameters (Megatron dist-opt group)
  const double edp = double(q.tp) * q.cp * dp / (double(q.ep) * q.etp);  // expert data parallel size
  const PipelineSplit lay = split_layers(int(m.layers.size()), q.pp, q.vpp).value();
  const bool full = p.recompute == Recompute::Full;
  const int n_chunks = std::max(1, p.moe.ep_chunks);
  // With n chunks one chunk's MoE buffers are live, plus the overlapped neighbour's share (article section 2.4).
  const double chunk_factor = n_chunks == 1 ? 1.0 : std::min(1.0, (1.0 + cal.moe_chunk_overlap) / n_chunks);

  // Communicators this rank belongs to (NCCL allocates buffers per communicator).
  const int groups = (q.tp > 1) + (q.cp > 1) + (dp * q.cp > 1) + (q.pp > 1) + (q.ep > 1) + (q.etp > 1) + (edp > 1);
  const double workspace = cal.workspace_bytes + cal.nccl_bytes_per_group * groups;

  // Activations per distinct layer kind are the same on every stage: compute each kind once.
  // Parameters and activations per distinct layer kind are the same everywhere: compute each kind once.
  struct Kind {
    LayerSpec spec;
    UnitParams params;
    LayerActivation rec, keep;  // recomputed / not recomputed
  };
  std::vector<Kind> kinds;
  kinds.reserve(6);
  // Per-stage sums gathered in one pass over the layers (the search calls this millions of times).
  struct StageAcc {
    StageParams params;
    double act = 0, working = 0, whole = 0, inflight_sum = 0;  // whole: the largest layer's activations, entire
    int layers = 0;
    bool has_moe = false;
  };
  std::vector<StageAcc> acc(q.pp);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerSpec& l = m.layers[i];
    size_t k = 0;
    while (k < kinds.size() && !(kinds[k].spec.mixer == l.mixer && kinds[k].spec.ffn == l.ffn)) ++k;
    if (k == kinds.size())
      kinds.push_back({l, unit_params(layer_params(m, l), q), layer_activation(m, p, l, full), layer_activation(m, p, l, false)});
    const Kind& kind = kinds[k];
    const int r = lay.stage_of(int(i));
    const int j = lay.vchunk_of(int(i));
    StageAcc& a = acc[r];
    a.params.dense += kind.params.dense;
    a.params.expert += kind.params.expert;
    a.params.max_unit = std::max(a.params.max_unit, kind.params.dense + kind.params.expert);
    const int pos = lay.pos_in_chunk(int(i));  // Megatron "block" recompute: the first N layers of each chunk
    const bool rec = full && (p.recompute_layers == 0 || pos < p.recompute_layers);
    const LayerActivation& la = rec ? kind.rec : kind.keep;
    const double n_in = inflight(r, j, q.pp, q.vpp, mbs);
    a.act += n_in * la.saved;
    a.inflight_sum += n_in;
    // During its backward a layer is whole on the device: full recompute rebuilds it (chunked EP one chunk of routed
    // tokens at a time), selective recompute rebuilds what it dropped; that rebuilt part is the working set.
    const double whole = rec ? (la.full - la.moe_tokens) + la.moe_tokens * chunk_factor : la.full;
    if (rec || p.recompute == Recompute::Selective) a.working = std::max(a.working, whole - la.saved);
    a.whole = std::max(a.whole, whole);
    a.has_moe = a.has_moe || l.ffn == FfnKind::MoE;
    a.layers++;
  }
  const double moe_tok = routed_tokens(m, p, s);
  double mtp_saved = 0, mtp_working = 0;
  if (m.mtp_layers > 0 && !m.layers.empty()) {
    const LayerActivation a = layer_activation(m, p, m.layers.back(), full);
    mtp_saved = m.mtp_layers * a.saved;
    mtp_working = a.full - a.saved;
  }

  MemoryEstimate est;
  est.stages.reserve(q.pp);
  for (int r = 0; r < q.pp; ++r) {
    StageMemory st;
    st.stage = r;
    const bool last = r == q.pp - 1;
    StageParams& sp = acc[r].params;
    add_edge_units(m, q, r, sp);

    MemoryBreakdown stat;
    const double grad_b = cal.main_grad_bytes;
    switch (p.optimizer_sharding) {
      case OptimizerSharding::None:
        stat.params = kBf16 * (sp.dense + sp.expert);
        stat.grads = grad_b * (sp.dense + sp.expert);
        stat.optimizer = kAdamBytes * (sp.dense + sp.expert);
        break;
      case OptimizerSharding::DistOpt:  // ZeRO-1: optimizer sharded over DP*CP (dense) and expert-DP (experts)
        stat.params = kBf16 * (sp.dense + sp.expert);
        stat.grads = grad_b * (sp.dense + sp.expert);
        stat.optimizer = kAdamBytes * (sp.dense / dense_shard + sp.expert / edp);
        break;
      case OptimizerSharding::Fsdp: {  // ZeRO-3: everything sharded over the same groups
        const double shard = sp.dense / dense_shard + sp.expert / edp;
        stat.params = kBf16 * shard;
        stat.grads = grad_b * shard;
        stat.optimizer = kAdamBytes * shard;
        break;
      }
    }
    if (p.offload.optimizer) stat.optimizer = 0;

    // Saved activations of in-flight microbatches, and the largest rematerialized layer's extra working set.
    double act = acc[r].act, working = acc[r].working;
    st.layers = acc[r].layers;
    const bool stage_has_moe = acc[r].has_moe;
    if (last) {
      act += mtp_saved;  // MTP modules run on the last stage for the one microbatch in flight there
      if (full) working = std::max(working, mtp_working);
    }
    if (p.offload.activations) {
      // Saved activations live on the host; the layer being backpropagated comes back whole.
      act = 0;
      working = std::max(working, acc[r].whole);
    }
    st.inflight_microbatches = st.layers > 0 ? acc[r].inflight_sum / st.layers : 0;

    const double moe_buf = stage_has_moe ? cal.moe_buffer_copies * kBf16 * moe_tok * m.hidden * chunk_factor : 0;

    // Loss side (last stage): fp32 logits tokens x vocab/tp (article section 2.3) or linear CE's streaming state.
    double logits = 0;
    if (last) {
      const double vocab_local = double(m.vocab) / q.tp;
      if (p.linear_ce) {
        const double tile = std::min(cal.linear_ce_vocab_tile, vocab_local);
        logits = s.S * tile * kBf16 + s.S * 4 * kFp32 + s.S * m.hidden * kFp32;  // tile, per-token stats, fp32 d_hidden
      } else {
        logits = s.S * vocab_local * cal.logits_bytes_per_element;
      }
    }

    double fsdp_gather = 0, fsdp_grad = 0;
    if (p.optimizer_sharding == OptimizerSharding::Fsdp) {
      fsdp_gather = kBf16 * (1 + cal.fsdp_prefetch_units) * sp.max_unit;  // current + prefetched unit
      fsdp_grad = grad_b * sp.max_unit;                                  // unsharded gradient before reduce-scatter
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
