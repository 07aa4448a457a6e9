// The memory and time physics of a plan's run settings (estimator/run_settings.h), in named functions the memory
// and time models call: bytes per parameter of the gradient buffer, the optimizer state and the weights, the static
// buffers that dispatchers, TP overlap and CUDA graphs add, and the launch floors CUDA graphs remove.
#pragma once

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/plan.h"

namespace lcplan {

// Main-gradient buffer bytes per parameter, also what the DP reduce-scatter / all-reduce moves per parameter: the
// parameter dtype unless gradients accumulate in fp32 (Megatron-LM param_and_grad_buffer.py: grad_reduce_in_fp32).
double grad_bytes_per_param(const Plan& p);

// Optimizer state bytes per parameter: the master weight and the two Adam moments in their dtypes.
double optimizer_state_bytes_per_param(const Plan& p);

// Weight bytes per parameter on the device: bf16 (or fp8 with fp8 parameters) plus a low-precision recipe's copy.
double param_bytes_per_param(const Plan& p, const Calibration& cal);

// Bytes per parameter the DP / FSDP parameter all-gather moves (fp8 with --fp8-param-gather, except mxfp8).
double param_gather_bytes_per_param(const Plan& p);

// Static buffers of one stage the run settings add (bytes): DeepEP / HybridEP buffers, TE userbuffers, CUDA graphs'
// static inputs.
double run_settings_workspace(const DerivedPlan& d, const StageRecord& st, const Calibration& cal);

// HBM bytes per local parameter of the optimizer step, scaled from the calibrated fp32 figure by the dtypes read
// (gradient, master, moments) and written (master, moments, bf16 parameter).
double optimizer_step_bytes_per_param(const Plan& p, const Calibration& cal);

// Launch floors CUDA graphs leave: the share of a decoder layer's non-MoE kernels still launched one by one, and of a
// MoE chunk's. 1 without graphs; 0 for what the graph captures.
struct LaunchShares {
  double dense_layer = 1;  // a dense layer's non-MoE kernels (attention + MLP)
  double moe_layer = 1;    // a MoE layer's non-MoE kernels (attention)
  double moe_chunk = 1;    // a MoE chunk's kernels
  bool sync = true;        // the dropless host sync stays (not captured)
  double step_host = 1;    // the eager step's fixed host work around the passes (step_overhead_seconds)
};
LaunchShares graph_launch_shares(const Plan& p, const Calibration& cal);

}  // namespace lcplan
