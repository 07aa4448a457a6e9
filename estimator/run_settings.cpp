#include "estimator/run_settings.h"

#include "common/user_error.h"

namespace lcplan {

namespace {

template <typename E, size_t N>
E parse_named(const std::string& s, const char* const (&names)[N], const std::string& what) {
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i]) return static_cast<E>(i);
    list += (i ? ", " : "") + std::string(names[i]);
  }
  throw UserError(what + " \"" + s + "\" is not valid (valid: " + list + ")");
}

const char* const kDtypes[] = {"fp32", "bf16", "fp16", "fp8", "fp64"};
const char* const kFp8Recipes[] = {"tensorwise", "delayed", "blockwise"};
const char* const kRecomputeMethods[] = {"block", "uniform"};
const char* const kGraphImpls[] = {"none", "local", "transformer_engine", "full_iteration"};
const char* const kCpComms[] = {"p2p", "allgather", "a2a", "a2a+p2p"};
const char* const kRoutings[] = {"forced", "aux_loss"};

}  // namespace

const char* to_string(Dtype d) { return kDtypes[static_cast<int>(d)]; }

double dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::FP32: return 4;
    case Dtype::BF16:
    case Dtype::FP16: return 2;
    case Dtype::FP8: return 1;
    case Dtype::FP64: return 8;
  }
  return 4;
}

Dtype parse_dtype(const std::string& s, const std::string& what, const std::vector<Dtype>& valid) {
  std::string list;
  for (Dtype d : valid) {
    if (s == to_string(d)) return d;
    list += (list.empty() ? "" : ", ") + std::string(to_string(d));
  }
  throw UserError(what + " \"" + s + "\" is not valid (valid: " + list + ")");
}

const char* to_string(Fp8Recipe r) { return kFp8Recipes[static_cast<int>(r)]; }
Fp8Recipe parse_fp8_recipe(const std::string& s) { return parse_named<Fp8Recipe>(s, kFp8Recipes, "fp8 recipe"); }
const char* to_string(RecomputeMethod m) { return kRecomputeMethods[static_cast<int>(m)]; }
RecomputeMethod parse_recompute_method(const std::string& s) {
  return parse_named<RecomputeMethod>(s, kRecomputeMethods, "recompute_method");
}
const char* to_string(GraphImpl g) { return kGraphImpls[static_cast<int>(g)]; }
GraphImpl parse_graph_impl(const std::string& s) { return parse_named<GraphImpl>(s, kGraphImpls, "cuda graph impl"); }
const char* to_string(CpComm c) { return kCpComms[static_cast<int>(c)]; }
CpComm parse_cp_comm(const std::string& s) { return parse_named<CpComm>(s, kCpComms, "cp comm type"); }
const char* to_string(Routing r) { return kRoutings[static_cast<int>(r)]; }
Routing parse_routing(const std::string& s) { return parse_named<Routing>(s, kRoutings, "moe routing"); }

// Names as Megatron-LM spells them (transformer_config.py recompute_modules, offload_modules, cuda_graph_modules).
const std::vector<ModuleName>& recompute_module_names() {
  static const std::vector<ModuleName> t = {
      {"core_attn", kRecomputeCoreAttn}, {"layernorm", kRecomputeLayernorm}, {"mla_up_proj", kRecomputeMlaUpProj},
      {"moe_act", kRecomputeMoeAct},     {"mlp", kRecomputeMlp},             {"moe", kRecomputeMoe},
      {"shared_experts", kRecomputeSharedExperts}};
  return t;
}

const std::vector<ModuleName>& offload_module_names() {
  static const std::vector<ModuleName> t = {
      {"attn_norm", kOffloadAttnNorm}, {"qkv_linear", kOffloadQkvLinear}, {"core_attn", kOffloadCoreAttn},
      {"attn_proj", kOffloadAttnProj}, {"mlp_norm", kOffloadMlpNorm},     {"expert_fc1", kOffloadExpertFc1},
      {"moe_act", kOffloadMoeAct}};
  return t;
}

const std::vector<ModuleName>& graph_module_names() {
  static const std::vector<ModuleName> t = {{"attn", kGraphAttn},
                                            {"mlp", kGraphMlp},
                                            {"moe", kGraphMoe},
                                            {"moe_router", kGraphMoeRouter},
                                            {"moe_preprocess", kGraphMoePreprocess}};
  return t;
}

uint16_t parse_modules(const std::vector<std::string>& names, const std::vector<ModuleName>& table, const std::string& what) {
  uint16_t bits = 0;
  for (const std::string& n : names) {
    bool found = false;
    for (const ModuleName& m : table)
      if (n == m.name) bits |= m.bit, found = true;
    if (found) continue;
    std::string list;
    for (const ModuleName& m : table) list += (list.empty() ? "" : ", ") + std::string(m.name);
    throw UserError(what + " \"" + n + "\" is not valid (valid: " + list + ")");
  }
  return bits;
}

std::vector<std::string> module_list(uint16_t bits, const std::vector<ModuleName>& table) {
  std::vector<std::string> out;
  for (const ModuleName& m : table)
    if (bits & m.bit) out.push_back(m.name);
  return out;
}

std::string module_text(uint16_t bits, const std::vector<ModuleName>& table) {
  std::string s;
  for (const std::string& n : module_list(bits, table)) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "none" : s;
}

}  // namespace lcplan
