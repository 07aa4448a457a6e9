// The capability checks of estimator/frameworks.h (one row per field a framework may not run) and the resolution of
// a plan's unset run settings to its framework's defaults.
#include <cstdio>

#include "estimator/frameworks.h"

namespace lcplan {

namespace {

bool has_moe(const ModelSpec& m) {
  for (const LayerSpec& l : m.layers)
    if (l.ffn == FfnKind::MoE) return true;
  return false;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// One field a framework may not run: whether the plan uses it, its value as words, and whether a framework runs it.
struct CapabilityRow {
  const char* field;
  bool (*used)(const ModelSpec&, const Plan&);
  std::string (*value)(const Plan&);
  bool (*runs)(const Capabilities&, const ModelSpec&, const Plan&);
};

bool moe_with_ep(const ModelSpec& m, const Plan& p) { return has_moe(m) && p.parallel.ep > 1; }
bool low_precision(const Plan& p) { return p.precision != Precision::BF16; }
bool optimizer_state_dtypes(const Plan& p) {
  const OptimizerNumerics& o = p.optimizer;
  return o.precision_aware || o.main_params != Dtype::FP32 || o.exp_avg != Dtype::FP32 || o.exp_avg_sq != Dtype::FP32;
}
uint8_t bit8(int v) { return uint8_t(1u << v); }

const std::vector<CapabilityRow>& capability_rows() {
  static const std::vector<CapabilityRow> rows = {
      {"moe.ep_chunks", [](const ModelSpec&, const Plan& p) { return p.moe.ep_chunks > 1; },
       [](const Plan& p) { return std::to_string(p.moe.ep_chunks) + " (chunked EP)"; },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.chunked_ep; }},
      {"moe.a2a_overlap", [](const ModelSpec&, const Plan& p) { return p.moe.a2a_overlap; },
       [](const Plan&) { return std::string("true (all-to-all overlapped across microbatches)"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.ep_overlap; }},
      {"packed_lengths", [](const ModelSpec&, const Plan& p) { return !p.packed_lengths.empty(); },
       [](const Plan& p) { return std::to_string(p.packed_lengths.size()) + " sequences packed in a microbatch (THD)"; },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.packed_sequences; }},
      {"hybrid_cp", [](const ModelSpec&, const Plan& p) { return p.hybrid_cp; }, [](const Plan&) { return std::string("true"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.hybrid_cp; }},
      {"linear_ce", [](const ModelSpec&, const Plan& p) { return p.linear_ce; }, [](const Plan&) { return std::string("true"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.linear_ce; }},
      {"precision", [](const ModelSpec&, const Plan& p) { return low_precision(p); },
       [](const Plan& p) { return std::string(to_string(p.precision)); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.low_precision; }},
      {"fp8.param_gather", [](const ModelSpec&, const Plan& p) { return p.fp8.param_gather; },
       [](const Plan&) { return std::string("true"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.fp8_extras; }},
      {"fp8.attention", [](const ModelSpec&, const Plan& p) { return p.fp8.attention; }, [](const Plan&) { return std::string("true"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.fp8_extras; }},
      {"offload.optimizer", [](const ModelSpec&, const Plan& p) { return p.offload.optimizer; },
       [](const Plan& p) { return "true (fraction " + number(p.offload.optimizer_fraction) + ")"; },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) {
         return c.optimizer_offload && (p.offload.optimizer_fraction == 1.0 || c.partial_optimizer_offload);
       }},
      {"offload.activations", [](const ModelSpec&, const Plan& p) { return p.offload.activations; },
       [](const Plan&) { return std::string("true"); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.activation_offload; }},
      {"offload.modules", [](const ModelSpec&, const Plan& p) { return p.offload.modules != 0; },
       [](const Plan& p) { return module_text(p.offload.modules, offload_module_names()); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.module_offload; }},
      {"optimizer (state dtypes)", [](const ModelSpec&, const Plan& p) { return optimizer_state_dtypes(p); },
       [](const Plan& p) {
         return std::string(to_string(p.optimizer.main_params)) + " master, " + to_string(p.optimizer.exp_avg) + "/" +
                to_string(p.optimizer.exp_avg_sq) + " moments, precision-aware " + (p.optimizer.precision_aware ? "on" : "off");
       },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.optimizer_dtypes; }},
      {"optimizer.grad_dtype", [](const ModelSpec&, const Plan& p) { return p.optimizer.grad != Dtype::FP32; },
       [](const Plan& p) { return std::string(to_string(p.optimizer.grad)); },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.bf16_grads; }},
      {"moe.capacity_factor", [](const ModelSpec& m, const Plan& p) { return has_moe(m) && p.moe.capacity_factor > 0; },
       [](const Plan& p) { return number(p.moe.capacity_factor) + " (token dropping)"; },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.token_dropping; }},
      {"recompute_method",
       [](const ModelSpec&, const Plan& p) {
         return p.recompute == Recompute::Full && p.recompute_method == RecomputeMethod::Uniform && p.recompute_layers > 1;
       },
       [](const Plan& p) { return "uniform with " + std::to_string(p.recompute_layers) + " layers per checkpoint"; },
       [](const Capabilities& c, const ModelSpec&, const Plan&) { return c.uniform_groups; }},
      {"recompute_modules", [](const ModelSpec&, const Plan& p) { return p.recompute == Recompute::Selective; },
       [](const Plan& p) { return module_text(p.recompute_modules, recompute_module_names()); },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) {
         return c.exact_recompute_set ? p.recompute_modules == c.recompute_modules
                                      : (p.recompute_modules & ~c.recompute_modules) == 0;
       }},
      {"moe.dispatcher", [](const ModelSpec& m, const Plan& p) { return moe_with_ep(m, p); },
       [](const Plan& p) { return std::string(to_string(p.moe.dispatcher)); },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) {
         return (c.dispatchers & bit8(static_cast<int>(p.moe.dispatcher))) != 0;
       }},
      {"cuda_graphs.impl", [](const ModelSpec&, const Plan& p) { return p.cuda_graphs.impl != GraphImpl::None; },
       [](const Plan& p) { return std::string(to_string(p.cuda_graphs.impl)); },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) {
         return (c.graph_impls & bit8(static_cast<int>(p.cuda_graphs.impl))) != 0;
       }},
      {"comm.cp", [](const ModelSpec&, const Plan& p) { return p.parallel.cp > 1 && p.comm.cp != CpComm::P2P; },
       [](const Plan& p) { return std::string(to_string(p.comm.cp)); },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) { return (c.cp_comms & bit8(static_cast<int>(p.comm.cp))) != 0; }},
      {"moe.router_dtype", [](const ModelSpec& m, const Plan&) { return has_moe(m); },
       [](const Plan& p) { return std::string(to_string(p.moe.router_dtype)); },
       [](const Capabilities& c, const ModelSpec&, const Plan& p) {
         return (c.router_dtypes & bit8(static_cast<int>(p.moe.router_dtype))) != 0;
       }},
  };
  return rows;
}

}  // namespace

std::string framework_support_error(const Framework& fw, const ModelSpec& m, const Plan& p) {
  if (fw.can.limits)
    if (std::string e = fw.can.limits(m, p); !e.empty()) return e;
  for (const CapabilityRow& row : capability_rows()) {
    if (!row.used(m, p) || row.runs(fw.can, m, p)) continue;
    std::string others;
    for (const Framework& f : frameworks())
      if (&f != &fw && row.runs(f.can, m, p)) others += (others.empty() ? "" : ", ") + std::string(f.name);
    return std::string(row.field) + " = " + row.value(p) + " is not something " + fw.name + " runs (" +
           (others.empty() ? std::string("no framework lcplan knows runs it") : "run by " + others) + ")";
  }
  return "";
}

std::string framework_support_error(const ModelSpec& m, const Plan& p) {
  const Framework* fw = find_framework(p.implementation);
  return fw ? framework_support_error(*fw, m, p) : "";
}

namespace {

std::string onoff(bool v) { return v ? "on" : "off"; }

std::string optimizer_words(const OptimizerNumerics& o) {
  if (o == OptimizerNumerics{o.grad}) return "fp32 master and moments";
  return std::string(to_string(o.main_params)) + " master, " + to_string(o.exp_avg) + "/" + to_string(o.exp_avg_sq) +
         " moments, precision-aware " + onoff(o.precision_aware);
}

}  // namespace

std::vector<std::string> resolve_run_defaults(Plan& p, const ModelSpec& m, const Calibration& cal, bool recommended) {
  std::vector<std::string> said;
  const Framework* fw = find_framework(p.implementation);
  const uint32_t a = p.assumed;
  p.assumed = 0;
  if (!fw || !a) return said;
  const RunDefaults& d = recommended ? fw->recommended : fw->defaults;
  const bool moe = has_moe(m), low = p.precision != Precision::BF16, fp8 = p.precision == Precision::FP8;
  // Sets the field when it was left unset and says so when it matters for this model and plan. MoE settings stay at
  // their plan defaults on dense models, where nothing reads them (so a dense plan reads back as written).
  const uint32_t moe_fields = kFieldDispatcher | kFieldRouting | kFieldRoutingImbalance | kFieldRouterDtype |
                              kFieldPermuteFusion | kFieldPadToCapacity;
  auto take = [&](uint32_t field, bool relevant, auto apply, const std::string& words) {
    if (!(a & field) || (!moe && (field & moe_fields))) return;
    apply();
    if (relevant) said.push_back(words);
  };
  take(kFieldGradDtype, true, [&] { p.optimizer.grad = d.optimizer.grad; }, std::string("grad_dtype ") + to_string(d.optimizer.grad));
  take(kFieldOptimizerDtypes, true, [&] { p.optimizer = OptimizerNumerics{p.optimizer.grad, d.optimizer.main_params,
                                                                          d.optimizer.exp_avg, d.optimizer.exp_avg_sq,
                                                                          d.optimizer.precision_aware, p.optimizer.instances}; },
       "optimizer " + optimizer_words(d.optimizer));
  take(kFieldFp8Recipe, fp8, [&] { p.fp8.recipe = d.fp8.recipe; }, std::string("fp8 recipe ") + to_string(d.fp8.recipe));
  // Megatron-Bridge's fp8 presets gather fp8 parameters except blockwise and nvfp4 (training/mixed_precision.py).
  const bool gather = d.fp8.param_gather && low && p.precision != Precision::NVFP4 && !(fp8 && p.fp8.recipe == Fp8Recipe::Blockwise);
  take(kFieldFp8ParamGather, low, [&] { p.fp8.param_gather = gather; }, "fp8 param_gather " + onoff(gather));
  take(kFieldFp8Attention, low, [&] { p.fp8.attention = d.fp8.attention && low; }, "fp8 attention " + onoff(d.fp8.attention && low));
  take(kFieldRecomputeModules, p.recompute == Recompute::Selective, [&] { p.recompute_modules = d.recompute_modules; },
       "recompute_modules " + module_text(d.recompute_modules, recompute_module_names()));
  take(kFieldCudaGraphs, true, [&] { p.cuda_graphs = d.cuda_graphs; }, std::string("cuda_graphs ") + to_string(d.cuda_graphs.impl));
  take(kFieldDispatcher, moe && p.parallel.ep > 1, [&] { p.moe.dispatcher = d.dispatcher; },
       std::string("dispatcher ") + to_string(d.dispatcher));
  take(kFieldRouting, moe, [&] { p.moe.routing = d.routing; }, std::string("routing ") + to_string(d.routing));
  const double imbalance = p.moe.routing == Routing::Forced ? 1.0 : cal.aux_loss_imbalance;
  take(kFieldRoutingImbalance, moe, [&] { p.moe.routing_imbalance = imbalance; }, "routing_imbalance " + number(imbalance));
  take(kFieldRouterDtype, moe, [&] { p.moe.router_dtype = d.router_dtype; }, std::string("router_dtype ") + to_string(d.router_dtype));
  take(kFieldPermuteFusion, moe, [&] { p.moe.permute_fusion = d.permute_fusion; }, "permute_fusion " + onoff(d.permute_fusion));
  take(kFieldPadToCapacity, moe && p.moe.capacity_factor > 0, [&] { p.moe.pad_to_capacity = d.pad_to_capacity; },
       "pad_to_capacity " + onoff(d.pad_to_capacity));
  take(kFieldDpOverlap, true, [&] { p.comm.overlap_grad_reduce = p.comm.overlap_param_gather = d.dp_overlap; },
       "overlap_grad_reduce/param_gather " + onoff(d.dp_overlap));
  take(kFieldTpOverlap, p.parallel.tp > 1, [&] { p.comm.tp_overlap = d.tp_overlap; }, "tp_overlap " + onoff(d.tp_overlap));
  take(kFieldCpComm, p.parallel.cp > 1, [&] { p.comm.cp = d.cp; }, std::string("cp comm ") + to_string(d.cp));
  return said;
}

void apply_run_defaults(Plan& p, const ModelSpec& m) {
  const uint32_t assumed = p.assumed;
  Calibration keep;
  keep.aux_loss_imbalance = p.moe.routing_imbalance;
  resolve_run_defaults(p, m, keep);
  p.assumed = assumed;
}

}  // namespace lcplan
