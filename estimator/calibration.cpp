#include "estimator/calibration.h"

#include <cmath>
#include <filesystem>

#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

const std::vector<CoefficientInfo>& coefficient_table() {
  static const std::vector<CoefficientInfo> table = {
      {"memory.cuda_context_bytes", &Calibration::cuda_context_bytes, "CUDA context outside the allocator (bytes)", false},
      {"memory.workspace_bytes", &Calibration::workspace_bytes, "cuBLAS/attention workspaces and allocator reserve (bytes)", true},
      {"memory.nccl_bytes_per_group", &Calibration::nccl_bytes_per_group, "NCCL buffers per communicator (bytes)", false},
      {"memory.fragmentation", &Calibration::fragmentation, "allocator overhead as a fraction of dynamic bytes", true},
      {"memory.moe_buffer_copies", &Calibration::moe_buffer_copies, "live [tokens*top_k, hidden] bf16 buffers at the MoE peak", true},
      {"memory.moe_chunk_overlap", &Calibration::moe_chunk_overlap, "extra fraction of a neighbouring chunk's MoE buffers alive while overlapping", true},
      {"memory.logits_bytes_per_element", &Calibration::logits_bytes_per_element, "materialized logits element size (bytes)", false},
      {"memory.linear_ce_vocab_tile", &Calibration::linear_ce_vocab_tile, "vocabulary columns per linear-CE tile", false},
      {"memory.fsdp_prefetch_units", &Calibration::fsdp_prefetch_units, "FSDP units gathered ahead of the current one", false},
      {"memory.main_grad_bytes", &Calibration::main_grad_bytes, "bytes per gradient element between backward and optimizer", false},
      {"time.gemm_efficiency", &Calibration::gemm_efficiency, "dense bf16 GEMM: fraction of peak at large token counts", true, 0.05, 1.0},
      {"time.gemm_half_tokens", &Calibration::gemm_half_tokens, "tokens at which dense GEMM efficiency halves", true, 0, 65536},
      {"time.grouped_gemm_efficiency", &Calibration::grouped_gemm_efficiency, "grouped GEMM: fraction of peak at large tokens per expert", true, 0.05, 1.0},
      {"time.grouped_gemm_half_tokens", &Calibration::grouped_gemm_half_tokens, "tokens per local expert at half grouped-GEMM efficiency", true, 0, 65536},
      {"time.attention_efficiency", &Calibration::attention_efficiency, "flash attention fwd+bwd: fraction of bf16 peak at long sequences", true, 0.05, 1.0},
      {"time.attention_half_seq", &Calibration::attention_half_seq, "local sequence at half attention efficiency", true, 0, 65536},
      {"time.linear_attention_efficiency", &Calibration::linear_attention_efficiency, "gated DeltaNet kernels: fraction of bf16 peak", true, 0.01, 1.0},
      {"time.fp8_gemm_efficiency_ratio", &Calibration::fp8_gemm_efficiency_ratio, "FP8 GEMM efficiency relative to bf16", true, 0.3, 1.0},
      {"time.fp8_grouped_gemm_efficiency_ratio", &Calibration::fp8_grouped_gemm_efficiency_ratio, "FP8 grouped (expert) GEMM efficiency relative to bf16: per-token activation quantization and small per-expert shapes", true, 0.3, 1.0},
      {"time.linear_ce_slowdown", &Calibration::linear_ce_slowdown, "loss layer time with linear CE / materialized", true, 0.5, 3.0},
      {"time.hbm_efficiency", &Calibration::hbm_efficiency, "memory-bound kernels: fraction of HBM bandwidth", false, 0.1, 1.0},
      {"time.elementwise_passes", &Calibration::elementwise_passes, "hidden-sized bf16 tensors read+written per layer forward", true, 0, 200},
      {"time.moe_permute_passes", &Calibration::moe_permute_passes, "routed-copy-sized bf16 tensors read+written per MoE layer forward", true, 0, 100},
      {"time.launch_seconds", &Calibration::launch_seconds, "per-kernel launch floor (s)", true, 0, 1e-4},
      {"time.kernels_per_layer", &Calibration::kernels_per_layer, "kernels per decoder layer forward (MoE experts excluded)", false, 1, 1000},
      {"time.kernels_per_moe_chunk", &Calibration::kernels_per_moe_chunk, "kernels per MoE chunk forward", false, 1, 1000},
      {"time.nvlink_latency", &Calibration::nvlink_latency, "seconds per collective inside a node", true, 0, 1e-3},
      {"time.network_latency", &Calibration::network_latency, "seconds per collective across nodes", true, 0, 1e-3},
      {"time.nvlink_efficiency", &Calibration::nvlink_efficiency, "ring collectives: bus bandwidth / NVLink bandwidth", true, 0.05, 1.0},
      {"time.network_efficiency", &Calibration::network_efficiency, "ring collectives: bus bandwidth / network bandwidth", true, 0.05, 1.0},
      {"time.a2a_nvlink_efficiency", &Calibration::a2a_nvlink_efficiency, "all-to-all inside a node: achieved / NVLink bandwidth", true, 0.05, 1.0},
      {"time.a2a_network_efficiency", &Calibration::a2a_network_efficiency, "all-to-all across nodes: achieved / network bandwidth", true, 0.05, 1.0},
      {"time.a2a_latency", &Calibration::a2a_latency, "fixed seconds of one MoE all-to-all call (paid per chunk)", true, 0, 1e-2},
      {"time.moe_sync_seconds", &Calibration::moe_sync_seconds, "seconds per dropless MoE layer forward for the token-count exchange and host sync", true, 0, 1e-2},
      {"time.tp_overlap", &Calibration::tp_overlap, "fraction of TP collectives hidden under GEMMs", true, 0, 1},
      {"time.ep_overlap", &Calibration::ep_overlap, "fraction of exposed EP all-to-all hidden by cross-microbatch overlap (Megatron 1F1B A2A overlap)", true, 0, 1},
      {"time.dp_overlap", &Calibration::dp_overlap, "fraction of compute available to hide DP/FSDP collectives", true, 0, 1},
      {"time.dist_opt_overlap", &Calibration::dist_opt_overlap, "1 = DP grad reduce / param gather overlapped with compute, 0 = exposed", false, 0, 1},
      {"time.interference", &Calibration::interference, "compute slowdown per second of overlapped communication", true, 0, 1},
      {"time.optimizer_bytes_per_param", &Calibration::optimizer_bytes_per_param, "HBM bytes per local parameter in the optimizer step", false, 0, 1000},
      {"time.host_link_efficiency", &Calibration::host_link_efficiency, "fraction of the host link (PCIe / C2C) bandwidth achieved by offload copies", true, 0.05, 1},
      {"time.cpu_adam_params_per_second", &Calibration::cpu_adam_params_per_second, "parameters per second one GPU's share of the host CPU updates (offloaded Adam)", true, 1e6, 1e11},
  };
  return table;
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& name) {
  if (!j.is_object()) throw UserError("calibration \"" + name + "\" must be a JSON object");
  Calibration c;
  c.name = name;
  const auto& table = coefficient_table();
  if (!j.contains("coefficients") || !j.at("coefficients").is_object())
    throw UserError("calibration \"" + name + "\": field \"coefficients\" is missing or not an object");
  for (const auto& [key, _] : j.items())
    if (key != "coefficients" && key != "name" && key != "description")
      throw UserError("calibration \"" + name + "\": unknown top-level key \"" + key +
                      "\" (valid: name, description, coefficients)");
  const auto& coeffs = j.at("coefficients");
  for (const auto& [key, value] : coeffs.items()) {
    bool known = false;
    for (const auto& info : table) known = known || key == info.key;
    if (!known) throw UserError("calibration \"" + name + "\": unknown coefficient \"" + key + "\"");
  }
  for (const auto& info : table) {
    if (!coeffs.contains(info.key))
      throw UserError("calibration \"" + name + "\": coefficient \"" + info.key + "\" is missing");
    const auto& e = coeffs.at(info.key);
    if (!e.is_object() || !e.contains("value") || !e.at("value").is_number() || !std::isfinite(e.at("value").get<double>()) ||
        e.at("value").get<double>() < 0)
      throw UserError("calibration \"" + name + "\": coefficient \"" + info.key +
                      "\" needs a non-negative numeric \"value\"");
    if (!e.contains("provenance") || !e.at("provenance").is_string() || e.at("provenance").get<std::string>().empty())
      throw UserError("calibration \"" + name + "\": coefficient \"" + info.key + "\" needs a \"provenance\" string");
    c.*(info.member) = e.at("value").get<double>();
    c.provenance[info.key] = e.at("provenance").get<std::string>();
  }
  return c;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json coeffs = nlohmann::json::object();
  for (const auto& info : coefficient_table()) {
    auto it = c.provenance.find(info.key);
    coeffs[info.key] = {{"value", c.*(info.member)}, {"provenance", it == c.provenance.end() ? "unknown" : it->second}};
  }
  return {{"name", c.name}, {"coefficients", coeffs}};
}

Calibration load_calibration(const std::string& name_or_path, const std::string& data_dir) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  const std::string path = is_path ? name_or_path : data_dir + "/data/calibration/" + name_or_path + ".json";
  if (!is_path && !std::filesystem::exists(path))
    throw UserError("unknown implementation \"" + name_or_path +
                    "\" (valid calibration profiles: megatron, bumblebee, lcplan, or a path to a calibration JSON)");
  return calibration_from_json(read_json_file(path, "calibration file"), name_or_path);
}

}  // namespace lcplan
