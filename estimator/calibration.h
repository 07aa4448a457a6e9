// Calibration: the coefficients that cannot be derived from first principles, each with a provenance.
//
// One profile (data/calibration/<name>.json) serves every plan: base values, overridden per hardware profile
// (kernel efficiencies, collective bandwidths, host launch cost of that machine) and per implementation (framework
// overheads of Megatron-LM, bumblebee, the bundled executor). calibration_for() resolves the three layers for one
// (hardware, implementation) pair; the models read only the resolved flat record. Code holds no fitted numbers.
//
// JSON: {"name", "description",
//        "coefficients":       {"<key>": {"value", "provenance", "log_sigma"?}},
//        "per_hardware":       {"<hardware>": {"<key>": {"value", "provenance"}}},
//        "per_implementation": {"<implementation>": {"<key>": {"value", "provenance"}}},
//        "fit":        {how the profile was fitted, so `lcplan validate` can refit it without a group},
//        "validation": {"time": {"low", "high", "points", "source"}, "memory": {...}},
//        "profile":    {what `lcplan profile` measured: raw tables, fits, device, command; kept as is}}
// "log_sigma" makes a profile usable as a prior: the width of the prior in natural-log units (0.1 ~ +-10%).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lcplan {

struct Hardware;

// Relative residuals (predicted / measured - 1) of a profile's out-of-sample predictions: an estimate's band is
// [predicted / (1 + high), predicted / (1 + low)] for the measured value. Time: residuals of step time (validate
// turns a TFLOP/s row's into its step time's); memory: of peak bytes.
struct ErrorBand {
  double low = 0, high = 0;  // 10th and 90th percentile of the relative residuals
  int points = 0;            // 0: no validation, no band
  std::string source;
  std::vector<std::string> frameworks;  // calibration keys of the rows banded (empty: not recorded)
  // The range the measured value is expected in, for a prediction of a quantity whose residuals these are.
  double measured_low(double predicted) const { return points > 0 ? predicted / (1 + high) : predicted; }
  double measured_high(double predicted) const { return points > 0 ? predicted / (1 + low) : predicted; }
  // False when the band records its frameworks and `calibration_key` is not one of them.
  bool covers(const std::string& calibration_key) const;
};

struct Calibration {
  std::string name;

  // Memory.
  double cuda_context_bytes = 0;       // CUDA context + kernels image, outside the caching allocator
  double workspace_bytes = 0;          // cuBLAS/attention workspaces and allocator reserve
  double nccl_bytes_per_group = 0;     // NCCL buffers per communicator this rank belongs to
  double fragmentation = 0;            // caching-allocator overhead as a fraction of dynamic bytes
  double moe_buffer_copies = 0;        // live [tokens*top_k, hidden] bf16 buffers at the MoE peak, beyond saved activations
  double moe_chunk_overlap = 0;        // extra fraction of a neighbouring chunk's MoE buffers alive while overlapping
  double logits_bytes_per_element = 0; // materialized logits element size (fp32 logits: 4)
  double linear_ce_vocab_tile = 0;     // vocabulary columns per linear-CE tile
  double fsdp_prefetch_units = 0;      // FSDP units gathered ahead of the current one
  double low_precision_weight_bytes = 0;  // extra bytes per parameter for the fp8/fp4 weight copy of a low-precision recipe
  double dispatcher_buffer_bytes = 0;  // DeepEP / HybridEP communication buffers (NVLink + RDMA), allocated once
  double tp_overlap_buffers = 0;       // TE userbuffers of [local tokens, hidden] bf16 under --tp-comm-overlap

  // Routing.
  double aux_loss_imbalance = 0;       // busiest EP rank's routed tokens over the mean under an auxiliary-loss router

  // Time: compute efficiency by shape class, eff(x) = max * x / (x + half) (Calculon/SimuMax-style curves).
  double gemm_efficiency = 0;              // dense bf16 GEMM: fraction of peak at large token counts
  double gemm_half_tokens = 0;             // tokens at which dense GEMM efficiency is half its maximum
  double grouped_gemm_efficiency = 0;      // routed-expert grouped bf16 GEMM: fraction of peak at large tokens/expert
  double grouped_gemm_half_tokens = 0;     // tokens per local expert at half efficiency
  double fp8_gemm_ratio = 0;               // fp8 GEMM efficiency at the fp8 peak relative to bf16's at the bf16 peak
  double mxfp8_gemm_ratio = 0;             // the same for mxfp8 (block-scaled fp8)
  double nvfp4_gemm_ratio = 0;             // the same for nvfp4 at the fp4 peak
  double fp8_grouped_gemm_ratio = 0;       // grouped expert GEMMs in fp8 relative to bf16 grouped (per-expert scaling)
  double mxfp8_grouped_gemm_ratio = 0;     // the same in mxfp8
  double nvfp4_grouped_gemm_ratio = 0;     // the same in nvfp4
  double quantize_bytes_per_element = 0;   // HBM bytes moved per GEMM input element to quantize it (low precision)
  double attention_efficiency = 0;         // flash attention fwd+bwd: fraction of bf16 peak at long sequences, head dim 128
  double attention_half_seq = 0;           // local sequence at half attention efficiency
  double attention_wide_head_backward = 1;  // flash attention backward rate at head dim 256 relative to 128
  double attention_causal_ratio = 1;        // flash attention's rate under a causal mask relative to no mask
  double linear_attention_efficiency = 0;  // gated DeltaNet chunked kernels: fraction of bf16 peak
  double linear_ce_slowdown = 0;           // loss layer time with linear CE / with materialized logits
  double hbm_efficiency = 0;               // memory-bound kernels: fraction of HBM bandwidth
  double elementwise_passes = 0;           // hidden-sized bf16 tensors read+written per layer forward (norms, residual, rotary)
  double moe_permute_passes = 0;           // routed-token-copy-sized bf16 tensors read+written per MoE layer forward
  double launch_seconds = 0;               // host time to issue one kernel (framework dispatch + launch)
  double kernels_per_layer = 0;            // kernels per decoder layer forward, MoE expert part excluded
  double kernels_per_moe_chunk = 0;        // kernels per MoE chunk forward (permute, dispatch, fc1, act, fc2, combine...)
  double mlp_kernel_share = 0;             // share of kernels_per_layer in a dense layer's MLP block (CUDA graph scope mlp)
  double moe_router_kernel_share = 0;      // share of a MoE chunk's kernels a moe_router + moe_preprocess graph captures
  double unfused_permute_passes = 0;       // extra routed-copy-sized passes without fused permutation
  double fp8_attention_speedup = 0;        // fp8 flash attention rate over bf16's (--fp8-dot-product-attention)
  double step_overhead_seconds = 0;        // fixed host time per step outside the layers (optimizer launch, grad norm, logging)
  // Time: collectives, t = latency + bytes * factor(n) / (bandwidth(tier) * efficiency).
  double nvlink_latency = 0;               // seconds per collective inside a node
  double network_latency = 0;              // seconds per collective across nodes
  double nvlink_efficiency = 0;            // ring collectives: achieved bus bandwidth / NVLink bandwidth
  double network_efficiency = 0;           // ring collectives: achieved bus bandwidth / network bandwidth
  double a2a_nvlink_efficiency = 0;        // all-to-all inside a node
  double a2a_network_efficiency = 0;       // all-to-all across nodes
  double a2a_latency = 0;                  // fixed seconds of one MoE all-to-all call (per chunk: launch, layout, handshake)
  double moe_sync_seconds = 0;             // per dropless MoE layer forward: token-count exchange + device-to-host sync
  double tp_overlap = 0;                   // fraction of TP collectives hidden under GEMMs
  double ep_overlap = 0;                   // fraction of exposed EP all-to-all hidden when the plan overlaps it across microbatches
  double dp_overlap = 0;                   // fraction of compute available to hide DP / FSDP collectives
  double interference = 0;                 // compute slowdown per second of overlapped communication
  double optimizer_bytes_per_param = 0;    // HBM bytes moved per local parameter by the optimizer step
  double host_link_efficiency = 0;         // achieved fraction of the host link bandwidth for offload copies
  double cpu_adam_params_per_second = 0;   // offloaded Adam: parameters per second per GPU's share of the host CPU

  std::map<std::string, std::string> provenance;  // coefficient name -> where its value comes from
  std::map<std::string, double> log_sigma;         // coefficient name -> prior width (when the profile is a prior)

  struct Override {
    double value = 0;
    std::string provenance;
  };
  using Overrides = std::map<std::string, Override>;  // coefficient key -> value
  std::map<std::string, Overrides> per_hardware;        // hardware profile name -> overrides
  std::map<std::string, Overrides> per_implementation;  // implementation name -> overrides
  nlohmann::json fit;                                   // how it was fitted (calibrate/calibrate_fit.h FitSpec), or null
  nlohmann::json profile;                               // raw tables of `lcplan profile` (profiler/README.md), or null
  ErrorBand time_band, memory_band;
};

struct CoefficientInfo {
  const char* key;               // "memory.fragmentation"
  double Calibration::*member;
  const char* meaning;
  bool fittable;                 // lcplan calibrate may fit it from measurements
  double lo = 0;                 // physical range the fit is bounded to
  double hi = 1e300;
};
const std::vector<CoefficientInfo>& coefficient_table();
const CoefficientInfo* find_coefficient(const std::string& key);  // nullptr when unknown

// The flat record for one (hardware, implementation): base values, then that hardware's overrides, then that
// implementation's. Provenance follows the value. Unknown names simply have no overrides.
Calibration calibration_for(const Calibration& c, const std::string& hardware, const std::string& implementation);
// The same for a hardware profile: where the calibration has no overrides for it, those of the profile with the same
// GPU die (`same_chip_as`: an H200's tensor cores and clocks are an H100's, so are its kernels' efficiencies).
Calibration calibration_for(const Calibration& c, const Hardware& hw, const std::string& implementation);

// Every base coefficient must be present with a value and a provenance; unknown keys are errors, except the retired
// keys memory.main_grad_bytes and time.dist_opt_overlap (now the plan's optimizer.grad_dtype and comm overlap
// switches), which older profiles carry and are skipped.
Calibration calibration_from_json(const nlohmann::json& j, const std::string& name);
nlohmann::json calibration_to_json(const Calibration& c);
// A profile name under <data_dir>/data/calibration (default, priors) or a path.
Calibration load_calibration(const std::string& name_or_path, const std::string& data_dir);

// The implementations plans may name (estimator/frameworks.h). calibration_for reads the overrides of the
// implementation's calibration key (megatron-bridge reads megatron's).
const std::vector<std::string>& known_implementations();
// Throws UserError unless `implementation` is a known one or has overrides in the profile.
void require_known_implementation(const Calibration& profile, const std::string& implementation);

}  // namespace lcplan
