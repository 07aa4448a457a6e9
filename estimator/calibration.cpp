#include "estimator/calibration.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/frameworks.h"
#include "estimator/hardware.h"

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
      {"memory.low_precision_weight_bytes", &Calibration::low_precision_weight_bytes, "extra bytes per parameter for the fp8/fp4 weight copy", true, 0, 4},
      {"memory.dispatcher_buffer_bytes", &Calibration::dispatcher_buffer_bytes, "DeepEP / HybridEP communication buffers (bytes)", true, 0, 1e11},
      {"memory.tp_overlap_buffers", &Calibration::tp_overlap_buffers, "TE userbuffers of [local tokens, hidden] under TP overlap", false, 0, 64},
      {"routing.aux_loss_imbalance", &Calibration::aux_loss_imbalance, "busiest EP rank's routed tokens over the mean under aux-loss routing", true, 1, 4},
      {"time.gemm_efficiency", &Calibration::gemm_efficiency, "dense bf16 GEMM: fraction of peak at large token counts", true, 0.05, 1.0},
      {"time.gemm_half_tokens", &Calibration::gemm_half_tokens, "tokens at which dense GEMM efficiency halves", true, 0, 65536},
      {"time.grouped_gemm_efficiency", &Calibration::grouped_gemm_efficiency, "grouped GEMM: fraction of peak at large tokens per expert", true, 0.05, 1.0},
      {"time.grouped_gemm_half_tokens", &Calibration::grouped_gemm_half_tokens, "tokens per local expert at half grouped-GEMM efficiency", true, 0, 65536},
      {"time.attention_efficiency", &Calibration::attention_efficiency, "flash attention fwd+bwd: fraction of bf16 peak at long sequences", true, 0.05, 1.0},
      {"time.attention_half_seq", &Calibration::attention_half_seq, "local sequence at half attention efficiency", true, 0, 65536},
      {"time.attention_wide_head_backward", &Calibration::attention_wide_head_backward, "flash attention backward rate at head dim 256 relative to 128", true, 0.2, 1.0},
      {"time.attention_causal_ratio", &Calibration::attention_causal_ratio, "flash attention rate under a causal mask relative to no mask", true, 0.5, 1.0},
      {"time.linear_attention_efficiency", &Calibration::linear_attention_efficiency, "gated DeltaNet kernels: fraction of bf16 peak", true, 0.01, 1.0},
      {"time.fp8_gemm_ratio", &Calibration::fp8_gemm_ratio, "fp8 GEMM efficiency (at the fp8 peak) relative to bf16's", true, 0.3, 1.2},
      {"time.mxfp8_gemm_ratio", &Calibration::mxfp8_gemm_ratio, "mxfp8 GEMM efficiency (at the fp8 peak) relative to bf16's", true, 0.3, 1.2},
      {"time.nvfp4_gemm_ratio", &Calibration::nvfp4_gemm_ratio, "nvfp4 GEMM efficiency (at the fp4 peak) relative to bf16's", true, 0.1, 1.2},
      {"time.fp8_grouped_gemm_ratio", &Calibration::fp8_grouped_gemm_ratio, "fp8 grouped GEMM efficiency relative to bf16 grouped", true, 0.1, 2.0},
      {"time.mxfp8_grouped_gemm_ratio", &Calibration::mxfp8_grouped_gemm_ratio, "mxfp8 grouped GEMM efficiency relative to bf16 grouped", true, 0.1, 2.0},
      {"time.nvfp4_grouped_gemm_ratio", &Calibration::nvfp4_grouped_gemm_ratio, "nvfp4 grouped GEMM efficiency relative to bf16 grouped", true, 0.1, 2.0},
      {"time.quantize_bytes_per_element", &Calibration::quantize_bytes_per_element, "HBM bytes per GEMM input element to quantize it (low precision)", true, 0, 16},
      {"time.linear_ce_slowdown", &Calibration::linear_ce_slowdown, "loss layer time with linear CE / materialized", true, 0.5, 3.0},
      {"time.hbm_efficiency", &Calibration::hbm_efficiency, "memory-bound kernels: fraction of HBM bandwidth", true, 0.1, 1.0},
      {"time.elementwise_passes", &Calibration::elementwise_passes, "hidden-sized bf16 tensors read+written per layer forward", true, 0, 200},
      {"time.moe_permute_passes", &Calibration::moe_permute_passes, "routed-copy-sized bf16 tensors read+written per MoE layer forward", true, 0, 100},
      {"time.launch_seconds", &Calibration::launch_seconds, "host seconds to issue one kernel", true, 0, 2e-4},
      {"time.kernels_per_layer", &Calibration::kernels_per_layer, "kernels per decoder layer forward (MoE experts excluded)", false, 1, 1000},
      {"time.kernels_per_moe_chunk", &Calibration::kernels_per_moe_chunk, "kernels per MoE chunk forward", false, 1, 1000},
      {"time.mlp_kernel_share", &Calibration::mlp_kernel_share, "share of a dense layer's kernels in its MLP block", false, 0, 1},
      {"time.moe_router_kernel_share", &Calibration::moe_router_kernel_share, "share of a MoE chunk's kernels in routing and preprocessing", false, 0, 1},
      {"time.unfused_permute_passes", &Calibration::unfused_permute_passes, "extra routed-copy-sized passes without fused permutation", false, 0, 100},
      {"time.fp8_attention_speedup", &Calibration::fp8_attention_speedup, "fp8 flash attention rate over bf16's", true, 0.5, 4},
      {"time.step_overhead_seconds", &Calibration::step_overhead_seconds, "fixed host seconds per step outside the layers", true, 0, 10},
      {"time.nvlink_latency", &Calibration::nvlink_latency, "seconds per collective inside a node", true, 0, 1e-3},
      {"time.network_latency", &Calibration::network_latency, "seconds per collective across nodes", true, 0, 1e-3},
      {"time.nvlink_efficiency", &Calibration::nvlink_efficiency, "ring collectives: bus bandwidth / NVLink bandwidth", true, 0.05, 1.0},
      {"time.network_efficiency", &Calibration::network_efficiency, "ring collectives: bus bandwidth / network bandwidth", true, 0.05, 1.0},
      {"time.a2a_nvlink_efficiency", &Calibration::a2a_nvlink_efficiency, "all-to-all inside a node: achieved / NVLink bandwidth", true, 0.05, 1.0},
      {"time.a2a_network_efficiency", &Calibration::a2a_network_efficiency, "all-to-all across nodes: achieved / network bandwidth", true, 0.05, 1.0},
      {"time.a2a_latency", &Calibration::a2a_latency, "fixed seconds of one MoE all-to-all call (paid per chunk)", true, 0, 1e-2},
      {"time.moe_sync_seconds", &Calibration::moe_sync_seconds, "seconds per dropless MoE layer forward for the token-count exchange and host sync", true, 0, 1e-2},
      {"time.tp_overlap", &Calibration::tp_overlap, "fraction of TP collectives hidden under GEMMs", true, 0, 1},
      {"time.ep_overlap", &Calibration::ep_overlap, "fraction of exposed EP all-to-all hidden when the plan overlaps it across microbatches (Megatron --overlap-moe-expert-parallel-comm)", true, 0, 1},
      {"time.dp_overlap", &Calibration::dp_overlap, "fraction of compute available to hide DP/FSDP collectives", true, 0, 1},
      {"time.interference", &Calibration::interference, "compute slowdown per second of overlapped communication", true, 0, 1},
      {"time.optimizer_bytes_per_param", &Calibration::optimizer_bytes_per_param, "HBM bytes per local parameter in the optimizer step", false, 0, 1000},
      {"time.host_link_efficiency", &Calibration::host_link_efficiency, "fraction of the host link (PCIe / C2C) bandwidth achieved by offload copies", true, 0.05, 1},
      {"time.cpu_adam_params_per_second", &Calibration::cpu_adam_params_per_second, "parameters per second one GPU's share of the host CPU updates (offloaded Adam)", true, 1e6, 1e11},
  };
  return table;
}

const CoefficientInfo* find_coefficient(const std::string& key) {
  for (const auto& info : coefficient_table())
    if (key == info.key) return &info;
  return nullptr;
}

const std::vector<std::string>& known_implementations() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Framework& f : frameworks()) n.push_back(f.name);
    return n;
  }();
  return names;
}

void require_known_implementation(const Calibration& profile, const std::string& implementation) {
  const auto& known = known_implementations();
  if (std::find(known.begin(), known.end(), implementation) != known.end() ||
      profile.per_implementation.count(implementation))
    return;
  std::string list;
  for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
  for (const auto& [n, _] : profile.per_implementation)
    if (std::find(known.begin(), known.end(), n) == known.end()) list += ", " + n;
  throw UserError("unknown implementation \"" + implementation + "\" (valid: " + list + ")");
}

namespace {

// Base values, then each named layer's overrides in order (a later layer wins); provenance follows the value.
Calibration resolve_layers(const Calibration& c, const std::vector<std::pair<const Calibration::Overrides*, std::string>>& layers) {
  Calibration out = c;
  for (const auto& [layer, note] : layers) {
    if (!layer) continue;
    for (const auto& [key, o] : *layer) {
      out.*(find_coefficient(key)->member) = o.value;  // keys were checked when the profile was read
      out.provenance[key] = o.provenance + note;
    }
  }
  return out;
}

const Calibration::Overrides* layer_of(const std::map<std::string, Calibration::Overrides>& m, const std::string& name) {
  const auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

Calibration calibration_for(const Calibration& c, const std::string& hardware, const std::string& implementation) {
  return resolve_layers(c, {{layer_of(c.per_hardware, hardware), ""},
                            {layer_of(c.per_implementation, calibration_key(implementation)), ""}});
}

Calibration calibration_for(const Calibration& c, const Hardware& hw, const std::string& implementation) {
  const std::string chip = hw.same_chip_as.empty() || hw.same_chip_as == hw.name
                               ? ""
                               : " (" + hw.same_chip_as + "'s, the same chip as " + hw.name + ")";
  return resolve_layers(c, {{chip.empty() ? nullptr : layer_of(c.per_hardware, hw.same_chip_as), chip},
                            {layer_of(c.per_hardware, hw.name), ""},
                            {layer_of(c.per_implementation, calibration_key(implementation)), ""}});
}

namespace {

// Coefficients older profiles carry whose settings are plan fields now (optimizer.grad_dtype, the comm overlap
// switches): read and skipped.
bool retired(const std::string& key) { return key == "memory.main_grad_bytes" || key == "time.dist_opt_overlap"; }

std::string where(const std::string& name) { return "calibration \"" + name + "\""; }

double read_value(const nlohmann::json& e, const std::string& w, const std::string& key) {
  if (!e.is_object() || !e.contains("value") || !e.at("value").is_number() || !std::isfinite(e.at("value").get<double>()) ||
      e.at("value").get<double>() < 0)
    throw UserError(w + ": coefficient \"" + key + "\" needs a non-negative numeric \"value\"");
  return e.at("value").get<double>();
}

std::string read_provenance(const nlohmann::json& e, const std::string& w, const std::string& key) {
  if (!e.contains("provenance") || !e.at("provenance").is_string() || e.at("provenance").get<std::string>().empty())
    throw UserError(w + ": coefficient \"" + key + "\" needs a \"provenance\" string");
  return e.at("provenance").get<std::string>();
}

void check_entry_keys(const nlohmann::json& e, const std::string& w, const std::string& key, bool allow_sigma) {
  for (const auto& [k, _] : e.items())
    if (k != "value" && k != "provenance" && !(allow_sigma && k == "log_sigma"))
      throw UserError(w + ": coefficient \"" + key + "\" has unknown field \"" + k + "\" (valid: value, provenance" +
                      (allow_sigma ? ", log_sigma)" : ")"));
}

std::map<std::string, Calibration::Overrides> read_layer(const nlohmann::json& j, const std::string& w, const char* field) {
  std::map<std::string, Calibration::Overrides> out;
  if (!j.contains(field)) return out;
  const auto& layer = j.at(field);
  if (!layer.is_object()) throw UserError(w + ": \"" + field + "\" must be an object of {name: {coefficient: ...}}");
  for (const auto& [name, coeffs] : layer.items()) {
    const std::string lw = w + " " + field + " \"" + name + "\"";
    if (!coeffs.is_object()) throw UserError(lw + " must be an object of coefficients");
    for (const auto& [key, e] : coeffs.items()) {
      if (retired(key)) continue;
      if (!find_coefficient(key)) throw UserError(lw + ": unknown coefficient \"" + key + "\"");
      check_entry_keys(e, lw, key, false);
      out[name][key] = {read_value(e, lw, key), read_provenance(e, lw, key)};
    }
  }
  return out;
}

ErrorBand read_band(const nlohmann::json& v, const std::string& w, const char* which) {
  ErrorBand b;
  if (!v.contains(which)) return b;
  const auto& e = v.at(which);
  const std::string bw = w + " validation." + which;
  if (!e.is_object() || !e.contains("low") || !e.contains("high") || !e.at("low").is_number() || !e.at("high").is_number())
    throw UserError(bw + " needs numeric \"low\" and \"high\" relative residuals");
  b.low = e.at("low").get<double>();
  b.high = e.at("high").get<double>();
  if (!std::isfinite(b.low) || !std::isfinite(b.high) || b.low > b.high || b.low <= -1 || b.high > 10)
    throw UserError(bw + ": low must not exceed high, and both must lie in (-1, 10]");
  b.points = e.contains("points") && e.at("points").is_number_integer() ? e.at("points").get<int>() : 1;
  if (e.contains("source") && e.at("source").is_string()) b.source = e.at("source").get<std::string>();
  if (e.contains("frameworks")) {
    const auto& f = e.at("frameworks");
    if (!f.is_array() || !std::all_of(f.begin(), f.end(), [](const nlohmann::json& x) { return x.is_string(); }))
      throw UserError(bw + ".frameworks must be a list of implementation names, e.g. [\"megatron\"]");
    for (const auto& x : f) b.frameworks.push_back(x.get<std::string>());
  }
  return b;
}

nlohmann::json band_json(const ErrorBand& b) {
  nlohmann::json j = {{"low", b.low}, {"high", b.high}, {"points", b.points}, {"source", b.source}};
  if (!b.frameworks.empty()) j["frameworks"] = b.frameworks;
  return j;
}

}  // namespace

bool ErrorBand::covers(const std::string& calibration_key) const {
  return frameworks.empty() || std::find(frameworks.begin(), frameworks.end(), calibration_key) != frameworks.end();
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& name) {
  const std::string w = where(name);
  if (!j.is_object()) throw UserError(w + " must be a JSON object");
  Calibration c;
  c.name = name;
  for (const auto& [key, _] : j.items())
    if (key != "coefficients" && key != "name" && key != "description" && key != "per_hardware" &&
        key != "per_implementation" && key != "fit" && key != "validation" && key != "profile")
      throw UserError(w + ": unknown top-level key \"" + key +
                      "\" (valid: name, description, coefficients, per_hardware, per_implementation, fit, validation, "
                      "profile)");
  if (!j.contains("coefficients") || !j.at("coefficients").is_object())
    throw UserError(w + ": field \"coefficients\" is missing or not an object");
  const auto& coeffs = j.at("coefficients");
  for (const auto& [key, value] : coeffs.items())
    if (!find_coefficient(key) && !retired(key)) throw UserError(w + ": unknown coefficient \"" + key + "\"");
  for (const auto& info : coefficient_table()) {
    if (!coeffs.contains(info.key)) throw UserError(w + ": coefficient \"" + info.key + "\" is missing");
    const auto& e = coeffs.at(info.key);
    c.*(info.member) = read_value(e, w, info.key);
    check_entry_keys(e, w, info.key, true);
    c.provenance[info.key] = read_provenance(e, w, info.key);
    if (e.contains("log_sigma")) {
      const auto& s = e.at("log_sigma");
      if (!s.is_number() || !(s.get<double>() > 0) || s.get<double>() > 20)
        throw UserError(w + ": coefficient \"" + std::string(info.key) + "\" needs a positive \"log_sigma\" up to 20");
      c.log_sigma[info.key] = s.get<double>();
    }
  }
  c.per_hardware = read_layer(j, w, "per_hardware");
  c.per_implementation = read_layer(j, w, "per_implementation");
  if (j.contains("fit")) c.fit = j.at("fit");
  if (j.contains("profile")) {
    if (!j.at("profile").is_object()) throw UserError(w + ": \"profile\" must be an object (what lcplan profile measured)");
    c.profile = j.at("profile");
  }
  if (j.contains("validation")) {
    const auto& v = j.at("validation");
    if (!v.is_object()) throw UserError(w + ": \"validation\" must be an object");
    c.time_band = read_band(v, w, "time");
    c.memory_band = read_band(v, w, "memory");
  }
  return c;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json coeffs = nlohmann::json::object();
  for (const auto& info : coefficient_table()) {
    auto it = c.provenance.find(info.key);
    coeffs[info.key] = {{"value", c.*(info.member)}, {"provenance", it == c.provenance.end() ? "unknown" : it->second}};
    if (auto s = c.log_sigma.find(info.key); s != c.log_sigma.end()) coeffs[info.key]["log_sigma"] = s->second;
  }
  nlohmann::json j = {{"name", c.name}, {"coefficients", coeffs}};
  for (const auto& [field, layer] : {std::pair<const char*, const std::map<std::string, Calibration::Overrides>*>{
                                         "per_hardware", &c.per_hardware},
                                     {"per_implementation", &c.per_implementation}}) {
    if (layer->empty()) continue;
    nlohmann::json l = nlohmann::json::object();
    for (const auto& [name, over] : *layer)
      for (const auto& [key, o] : over) l[name][key] = {{"value", o.value}, {"provenance", o.provenance}};
    j[field] = l;
  }
  if (!c.fit.is_null()) j["fit"] = c.fit;
  if (!c.profile.is_null()) j["profile"] = c.profile;
  if (c.time_band.points > 0 || c.memory_band.points > 0) {
    j["validation"] = nlohmann::json::object();
    if (c.time_band.points > 0) j["validation"]["time"] = band_json(c.time_band);
    if (c.memory_band.points > 0) j["validation"]["memory"] = band_json(c.memory_band);
  }
  return j;
}

Calibration load_calibration(const std::string& name_or_path, const std::string& data_dir) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  const std::string path = is_path ? name_or_path : data_dir + "/data/calibration/" + name_or_path + ".json";
  if (!is_path && !std::filesystem::exists(path)) {
    std::string list;
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(data_dir + "/data/calibration", ec))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) list += n + ", ";
    throw UserError("unknown calibration profile \"" + name_or_path + "\" (valid: " + list + "or a path to a calibration JSON)");
  }
  return calibration_from_json(read_json_file(path, "calibration file"), name_or_path);
}

}  // namespace lcplan
