// Calibration: implementation-specific coefficients that cannot be derived from first principles.
// Each lives in data/calibration/<implementation>.json as {"value": x, "provenance": "..."}; code holds no numbers.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lcplan {

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
  double main_grad_bytes = 0;          // bytes per gradient element kept between backward and optimizer

  // Time: compute efficiency by shape class, eff(x) = max * x / (x + half) (Calculon/SimuMax-style curves).
  double gemm_efficiency = 0;              // dense bf16 GEMM: fraction of peak at large token counts
  double gemm_half_tokens = 0;             // tokens at which dense GEMM efficiency is half its maximum
  double grouped_gemm_efficiency = 0;      // routed-expert grouped GEMM: fraction of peak at large tokens/expert
  double grouped_gemm_half_tokens = 0;     // tokens per local expert at half efficiency
  double attention_efficiency = 0;         // flash attention fwd+bwd: fraction of bf16 peak at long sequences
  double attention_half_seq = 0;           // local sequence at half attention efficiency
  double linear_attention_efficiency = 0;  // gated DeltaNet chunked kernels: fraction of bf16 peak
  double fp8_gemm_efficiency_ratio = 0;    // FP8 GEMM efficiency relative to bf16 (applied at the fp8 peak)
  double fp8_grouped_gemm_efficiency_ratio = 0;  // the same for grouped expert GEMMs
  double linear_ce_slowdown = 0;           // loss layer time with linear CE / with materialized logits
  double hbm_efficiency = 0;               // memory-bound kernels: fraction of HBM bandwidth
  double elementwise_passes = 0;           // hidden-sized bf16 tensors read+written per layer forward (norms, residual, act)
  double moe_permute_passes = 0;           // routed-token-copy-sized bf16 tensors read+written per MoE layer forward
  double launch_seconds = 0;               // per-kernel launch floor (host overhead)
  double kernels_per_layer = 0;            // kernels per decoder layer forward, MoE expert part excluded
  double kernels_per_moe_chunk = 0;        // kernels per MoE chunk forward (permute, dispatch, fc1, act, fc2, combine...)
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
  double ep_overlap = 0;                   // fraction of exposed EP all-to-all hidden by cross-microbatch overlap
  double dp_overlap = 0;                   // fraction of compute available to hide DP / FSDP collectives
  double dist_opt_overlap = 0;             // 1 = grad reduce / param gather overlapped (Megatron --overlap-grad-reduce/--overlap-param-gather), 0 = exposed
  double interference = 0;                 // compute slowdown per second of overlapped communication
  double optimizer_bytes_per_param = 0;    // HBM bytes moved per local parameter by the optimizer step
  double host_link_efficiency = 0;         // achieved fraction of the host link bandwidth for offload copies
  double cpu_adam_params_per_second = 0;   // offloaded Adam: parameters per second per GPU's share of the host CPU

  std::map<std::string, std::string> provenance;  // coefficient name -> where its value comes from
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

// Every coefficient must be present with a value and a provenance; unknown keys are errors.
Calibration calibration_from_json(const nlohmann::json& j, const std::string& name);
nlohmann::json calibration_to_json(const Calibration& c);
// A profile name under <data_dir>/data/calibration (megatron, bumblebee, lcplan) or a path.
Calibration load_calibration(const std::string& name_or_path, const std::string& data_dir);

}  // namespace lcplan
