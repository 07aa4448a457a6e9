// Step time and throughput of a plan: FLOPs per op over calibrated efficiency, collectives by alpha-beta per link
// tier, overlap minus interference, pipeline bubble, recompute, per-kernel launch floor. Pure function.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/plan.h"
#include "estimator/derived_plan.h"
#include "parallel/rank_layout.h"
#include "models/model_spec.h"

namespace lcplan {

struct ExposedComm {
  double tp = 0, cp = 0, ep = 0, pp = 0, dp_fsdp = 0;  // seconds per step not hidden under compute
  double total() const { return tp + cp + ep + pp + dp_fsdp; }
};

struct TimeBreakdown {
  double compute = 0;          // forward + backward compute of the slowest stage over the step (s)
  double compute_attention = 0;  // of compute: the attention cores (flash attention, linear attention) (s)
  double compute_moe = 0;        // of compute: the MoE layers' kernels (s)
  double recompute = 0;        // extra forward of recomputed layers (s)
  ExposedComm exposed_comm;
  double hidden_cp = 0;          // the CP exchange hidden under the attention kernels (s; its exposed part is above)
  double bubble = 0;           // pipeline bubble (s)
  double launch_overhead = 0;  // per-kernel launch floor x kernel count not hidden by long kernels (s)
  double optimizer = 0;        // optimizer step, on the host when offloaded (s)
  double offload = 0;          // exposed host<->device copies of offloaded state (s)
  double step_overhead = 0;    // fixed host time per step outside the layers (s)
};

// The step split into the executor's phases (estimator/memory_model.h Phase): every term of TimeBreakdown assigned to
// the phase whose work it is; the four sum to step_seconds.
struct PhaseSeconds {
  double forward = 0;    // layers' forward (embedding to the last decoder layer), its collectives and launch floor
  double loss = 0;       // final norm, LM head and loss, forward and backward
  double backward = 0;   // layers' backward with their recompute, collectives and launch floor
  double optimizer = 0;  // gradient reduction and parameter gather left exposed, optimizer step, step overhead
  double total() const { return forward + loss + backward + optimizer; }
};

struct TimeEstimate {
  double step_seconds = 0;
  PhaseSeconds phases;               // step_seconds by phase
  double model_flops_per_step = 0;   // Megatron-style model FLOPs (recompute excluded), whole job
  double tflops_per_gpu = 0;         // model_flops_per_step / step_seconds / gpus / 1e12
  double mfu = 0;                    // tflops_per_gpu / peak of the plan's precision
  double tokens_per_second_per_gpu = 0;
  TimeBreakdown breakdown;
  std::string bottleneck;            // the largest breakdown term's name
};

// One MoE layer of the plan, one microbatch on one rank (router, shared and routed experts, permutation,
// dispatch/combine with the plan's ep_chunks overlap schedule). Seconds.
struct MoeLayerTime {
  double forward = 0, backward = 0;
  double exposed_comm_forward = 0, exposed_comm_backward = 0;  // all-to-all time not hidden under expert GEMMs
  double launch_forward = 0, launch_backward = 0;              // launch-floor excess included in forward/backward
  double shared_forward = 0;    // the shared experts' forward (what recompute module shared_experts replays)
  double activation_forward = 0;         // the routed experts' activation pass (what moe_act replays)
  double shared_activation_forward = 0;  // the shared experts' (replayed where moe_act covers every MLP)
};

// Per-microbatch cost of one layer (or a stage's layers) on one rank, split as the breakdown reports it (seconds).
struct LayerCost {
  double compute = 0;    // forward + backward GPU compute (with interference slowdown)
  double recompute = 0;  // extra forward compute of a recomputed layer
  double tp = 0, cp = 0, ep = 0;  // exposed communication
  double cp_hidden = 0;  // the CP exchange run under the attention kernels (ring p2p), not on the critical path
  double launch = 0;     // launch-floor excess
  double forward = 0, backward = 0;  // compute of forward / backward alone (the EP overlap cap)
  // Of compute (forward + backward, no recompute): the attention cores' kernels and the MoE layer's (router,
  // permutation, expert GEMMs, shared experts), so the breakdown can say what dominates at each sequence length.
  double attention = 0, moe = 0;
  // total() by the executor's phases: forward, loss (LM head and loss), backward (recompute included).
  double in_forward = 0, in_loss = 0, in_backward = 0;
  // Each pass's own span with the cross-microbatch EP overlap undone: what DP collectives and offload copies hide
  // under. in_forward / in_backward move time between passes as another microbatch's compute hides all-to-alls,
  // so a faster kernel can lengthen one of them; these only shrink.
  double span_forward = 0, span_backward = 0;
  void add(const LayerCost& o) {
    compute += o.compute, recompute += o.recompute, tp += o.tp, cp += o.cp, ep += o.ep, launch += o.launch;
    cp_hidden += o.cp_hidden;
    forward += o.forward, backward += o.backward;
    attention += o.attention, moe += o.moe;
    in_forward += o.in_forward, in_loss += o.in_loss, in_backward += o.in_backward;
    span_forward += o.span_forward, span_backward += o.span_backward;
  }
  double total() const { return compute + recompute + tp + cp + ep + launch; }
};

// What the time estimate reads from the derived record alone: the MoE layer, each layer kind's cost (recomputed or
// not), the decoder layers' costs summed per pipeline stage, the MTP modules, the loss and each stage's gradient
// and parameter collectives. Optimizer sharding, offload and the loss choice select among them, so the search
// computes them once per derived record.
struct StageCosts {
  MoeLayerTime moe;
  std::vector<std::array<LayerCost, 2>> kinds;  // [kind][recomputed]
  std::vector<LayerCost> stages;                 // per pipeline stage: its decoder layers
  std::vector<LayerCost> mtp;                    // each MTP module on the last stage, before its loss
  std::array<LayerCost, 2> loss;                 // LM head and loss of one microbatch [linear_ce]
  double pp_per_microbatch = 0;                  // exposed PP send/receive per microbatch
  struct Comm {
    double grad_all_reduce = 0, grad_reduce_scatter = 0, param_gather = 0;  // DP-CP and expert-DP groups together
  };
  std::vector<Comm> comm;  // per pipeline stage (stages like an earlier one: left zero)
};
StageCosts stage_costs(const DerivedPlan& d, const Hardware& hw, const Calibration& cal);
// The same with the record's MoE layer already timed (moe_layer_time of a record that differs at most in the
// recompute choice: the MoE layer's time does not read it).
StageCosts stage_costs(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, const MoeLayerTime& moe);

// Reads the plan's derived record (estimator/derived_plan.h); the plan must be valid (check_plan).
TimeEstimate estimate_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal);
// The same from the record's stage costs (stage_costs of this record under the same hardware and calibration).
TimeEstimate estimate_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal, const StageCosts& costs);
// Convenience for callers holding no derived record: derives it, then estimates.
TimeEstimate estimate_time(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal);
// Never below estimate_time's tokens_per_second_per_gpu for this record with the plan's linear_ce: the pipeline's
// part of the step alone (what follows it is not negative), which of the options reads only the loss (so records
// that differ in optimizer sharding or offload share it). The search skips the rest of a plan that could not be
// kept even at this rate.
double tokens_per_second_ceiling(const DerivedPlan& d, const Calibration& cal, const StageCosts& costs, bool linear_ce);

// Pieces exposed for tests and for the chunked-EP proxy.

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };

// Seconds for one collective on `n` ranks over `tier`, where `bytes` is the full buffer of one rank
// (all-gather: the gathered output; reduce-scatter / all-reduce / all-to-all: the input). nodes = nodes the group spans.
double collective_seconds(Collective c, double bytes, int n, LinkTier tier, int nodes, const Hardware& hw,
                          const Calibration& cal);

// Compute efficiency curve eff(x) = max * x / (x + half).
double efficiency_curve(double max, double half, double x);
// Flash attention's rate at `head_dim` relative to its calibrated rate (head dim 128 and up), forward and backward.
double attention_head_dim_factor(double head_dim);
// Seconds of flash attention's backward per second of its forward at `head_dim` (FLOPs 2.5x, rate per calibration).
double attention_backward_units(double head_dim, const Calibration& cal);

// Groups (ranks or nodes) of E/groups experts each that one token's k distinct experts reach on average.
double distinct_groups(double experts, double groups, double k);

// The same under the model's routing (group-limited routing draws its experts from topk_group of n_group groups).
double bins_reached(const MoeSpec& e, double bins);

// The plan's MoE layer (MoeLayerTime); zero on dense models.
MoeLayerTime moe_layer_time(const DerivedPlan& d, const Hardware& hw, const Calibration& cal);

}  // namespace lcplan
