#include "estimator/run_physics.h"

#include <algorithm>
#include <bit>

#include "estimator/frameworks.h"

namespace lcplan {

namespace {

constexpr double kBf16 = 2;  // bytes of a bf16 element

bool low_precision(const Plan& p) { return p.precision != Precision::BF16; }

// Weights held in fp8 (Megatron --fp8-param-gather with its fp8 parameters): only with sharded parameters, which
// Megatron requires for it (arguments.py), and not in nvfp4.
bool fp8_params(const Plan& p) {
  return p.fp8.param_gather && low_precision(p) && p.precision != Precision::NVFP4 &&
         p.optimizer_sharding != OptimizerSharding::None;
}

}  // namespace

double grad_bytes_per_param(const Plan& p) { return dtype_bytes(p.optimizer.grad); }

double optimizer_state_bytes_per_param(const Plan& p) {
  const OptimizerNumerics& o = p.optimizer;
  double master = dtype_bytes(o.main_params);
  // The precision-aware optimizer stores an fp32 master weight of a bf16 model as the int16 remainder beside the bf16
  // parameter, without fp8 or with the delayed recipe (Megatron-LM distrib_optimizer.py, store_param_remainders).
  const bool remainders = o.precision_aware && o.main_params == Dtype::FP32 &&
                          (p.precision == Precision::BF16 || (p.precision == Precision::FP8 && p.fp8.recipe == Fp8Recipe::Delayed));
  if (remainders) master = 2;
  // Adam's two moments in their storage dtypes (ZeRO paper, arXiv 1910.02054, section 3.1: 4 + 4 + 4 in fp32).
  return master + dtype_bytes(o.exp_avg) + dtype_bytes(o.exp_avg_sq);
}

double param_bytes_per_param(const Plan& p, const Calibration& cal) {
  // bf16 weights, or fp8 ones with fp8 parameters (no bf16 copy: Megatron-LM MoE README "FP8 Training"), plus the
  // low-precision copy a low-precision recipe keeps (Transformer Engine's weight cache).
  const double weight = fp8_params(p) ? gemm_input_bytes(p.precision, p.fp8.recipe) : kBf16;
  return weight + (low_precision(p) ? cal.low_precision_weight_bytes : 0.0);
}

double param_gather_bytes_per_param(const Plan& p) {
  // fp8 parameters are gathered in fp8, half of bf16's bytes, except mxfp8's (Megatron-LM MoE README "FP8 Training").
  return fp8_params(p) && p.precision != Precision::MXFP8 ? gemm_input_bytes(p.precision, p.fp8.recipe) : kBf16;
}

double optimizer_step_bytes_per_param(const Plan& p, const Calibration& cal) {
  // Adam reads the gradient, master and moments and writes master, moments and the bf16 parameter: g + 2 s + 2 bytes,
  // 30 in fp32, which the calibrated figure stands for.
  const double fp32 = 4 + 2 * 12 + kBf16;
  return cal.optimizer_bytes_per_param * (grad_bytes_per_param(p) + 2 * optimizer_state_bytes_per_param(p) + kBf16) / fp32;
}

double run_settings_workspace(const DerivedPlan& d, const StageRecord& st, const Calibration& cal) {
  const Plan& p = *d.plan;
  const double h = d.model->hidden;
  double bytes = 0;
  // DeepEP / HybridEP keep their NVLink and RDMA buffers for the run (fused_a2a.py get_buffer).
  if (st.has_moe && p.parallel.ep > 1 && deduplicating(p.moe.dispatcher)) bytes += cal.dispatcher_buffer_bytes;
  // TE userbuffers of [seq x mbs / cp, hidden] per overlapped GEMM (Megatron-LM initialize.py _initialize_tp_communicators).
  if (d.sequence_parallel && d.switches.tp_overlap) bytes += cal.tp_overlap_buffers * d.local_tokens * h * kBf16;
  const CudaGraphs& g = p.cuda_graphs;
  if (g.impl != GraphImpl::None) {
    // Each graph keeps static input buffers resident (Megatron-LM cuda_graphs.py): one hidden-sized input per captured
    // module and layer. The TE impl captures one microbatch at pp 1 without EP overlap, else every microbatch in
    // flight; the local impl at pp 1 shares one pool across microbatches (cuda_graphs.py).
    const bool whole = g.modules == 0 || g.impl == GraphImpl::FullIteration;
    const int per_layer = whole ? 1 : int(bool(g.modules & kGraphAttn)) + int(bool(g.modules & ~kGraphAttn));
    const bool one_microbatch = p.parallel.pp == 1 && (g.impl == GraphImpl::Local || !p.moe.a2a_overlap);
    const double layers = one_microbatch ? st.layers : st.inflight_sum;
    bytes += per_layer * layers * d.hidden_tokens * h * kBf16;
  }
  return bytes;
}

LaunchShares graph_launch_shares(const Plan& p, const Calibration& cal) {
  LaunchShares s;
  const CudaGraphs& g = p.cuda_graphs;
  // Token dropping with padding has static shapes, so the MoE layer is capturable and needs no host sync.
  const bool static_moe = static_moe_shapes(p);
  if (g.impl == GraphImpl::None) return s;
  // A captured graph replays its kernels without their host launches (CUDA graphs; Megatron-Bridge
  // docs/training/cuda-graphs.md: "removes per-kernel host launch and driver overhead").
  // A full-iteration graph replays the whole forward-backward schedule, its data and loss handling included
  // (Megatron-LM full_cuda_graph.py; it needs --no-check-for-nan-in-loss-and-grad, so no per-microbatch sync is
  // left): the fixed host time per step goes with it; the optimizer step stays eager and is costed by its bytes.
  // Issue 27 reports such runs (gpt-oss-20b on GB300) whose whole measured step is under the fitted fixed cost.
  if (g.impl == GraphImpl::FullIteration) s.step_host = 0;
  if (g.impl == GraphImpl::FullIteration || g.modules == 0) {
    s.dense_layer = s.moe_layer = 0;
    if (g.impl == GraphImpl::FullIteration || static_moe) s.moe_chunk = 0, s.sync = false;
    return s;
  }
  if (g.modules & kGraphAttn) s.dense_layer -= 1 - cal.mlp_kernel_share, s.moe_layer = 0;
  if (g.modules & kGraphMlp) s.dense_layer -= cal.mlp_kernel_share;
  if (g.modules & kGraphMoe) s.moe_chunk = 0, s.sync = false;
  else if (g.modules & (kGraphMoeRouter | kGraphMoePreprocess)) s.moe_chunk -= cal.moe_router_kernel_share;
  s.dense_layer = std::max(0.0, s.dense_layer);
  return s;
}

}  // namespace lcplan
