// The Megatron flag table's rows for the run settings (estimator/run_settings.h): gradient and optimizer dtypes,
// fp8 parameters and attention, fine-grained activation offloading, CUDA graphs, routing, the router's dtype,
// permutation fusion, the DP / TP overlap switches and the context-parallel communication type. A flag left out
// leaves its field to the implementation (Plan::assumed): for a Megatron-LM launch, Megatron-LM's default.
// Flag names, choices and rules: Megatron-LM megatron/training/arguments.py and the config dataclasses it is
// generated from (transformer_config.py, optimizer_config.py, distributed_data_parallel_config.py,
// model_parallel_config.py; https://github.com/NVIDIA/Megatron-LM).
#include <algorithm>
#include <cctype>
#include <set>

#include "common/flag_text.h"
#include "common/user_error.h"
#include "search/megatron_rows.h"

namespace lcplan {

namespace {

// A dtype as Megatron-LM spells it, or as a Megatron-Bridge override writes it (torch.bfloat16).
std::optional<Dtype> dtype_flag(const MegatronFlagSet& f, const char* flag, const std::vector<Dtype>& valid) {
  std::optional<std::string> t = f.text(flag);
  if (!t) return std::nullopt;
  static const std::map<std::string, std::string> torch = {{"torch.float32", "fp32"}, {"torch.bfloat16", "bf16"},
                                                           {"torch.float16", "fp16"}, {"torch.uint8", "fp8"}};
  if (const auto it = torch.find(*t); it != torch.end()) t = it->second;
  return parse_dtype(*t, flag, valid);
}

bool has_flags(const MegatronFlagSet& f, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (f.has(n)) return true;
  return false;
}

bool low_precision(const Plan& p) { return p.precision != Precision::BF16; }

// ---- gradients and optimizer state -----------------------------------------------------------------------------

// Under --bf16 Megatron accumulates and reduces gradients in fp32 unless --grad-reduce-in-bf16 or --main-grads-dtype
// bf16 (arguments.py validate_args); bf16 main gradients need the precision-aware optimizer (optimizer_config.py).
void read_grad_dtype(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  const bool bf16 = f.on("--grad-reduce-in-bf16"), fp32 = f.on("--accumulate-allreduce-grads-in-fp32");
  const auto main = dtype_flag(f, "--main-grads-dtype", {Dtype::FP32, Dtype::BF16});
  if (bf16 && fp32)
    throw UserError("--grad-reduce-in-bf16 contradicts --accumulate-allreduce-grads-in-fp32 (give one)");
  if (main == Dtype::BF16 && !f.on("--use-precision-aware-optimizer"))
    throw UserError("--main-grads-dtype bf16 needs --use-precision-aware-optimizer (Megatron-LM asserts it; add it)");
  if (!bf16 && !fp32 && !main) return;
  r.p.optimizer.grad = bf16 || main == Dtype::BF16 ? Dtype::BF16 : Dtype::FP32;
  r.p.assumed &= ~kFieldGradDtype;
}

void read_optimizer_state(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  if (!has_flags(f, {"--use-precision-aware-optimizer", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"})) return;
  OptimizerNumerics& o = r.p.optimizer;
  o.precision_aware = f.on("--use-precision-aware-optimizer");
  const std::vector<Dtype> moments = {Dtype::FP32, Dtype::FP16, Dtype::BF16, Dtype::FP8};
  o.main_params = dtype_flag(f, "--main-params-dtype", {Dtype::FP32, Dtype::FP16}).value_or(Dtype::FP32);
  o.exp_avg = dtype_flag(f, "--exp-avg-dtype", moments).value_or(Dtype::FP32);
  o.exp_avg_sq = dtype_flag(f, "--exp-avg-sq-dtype", moments).value_or(Dtype::FP32);
  r.p.assumed &= ~kFieldOptimizerDtypes;
  for (const auto& [flag, d] : {std::pair{"--main-params-dtype", o.main_params}, std::pair{"--exp-avg-dtype", o.exp_avg},
                                std::pair{"--exp-avg-sq-dtype", o.exp_avg_sq}})
    if (d != Dtype::FP32 && !o.precision_aware)
      throw UserError(std::string(flag) + " " + to_string(d) + " needs --use-precision-aware-optimizer (Megatron-LM stores "
                      "optimizer state in other dtypes only with it; add it)");
}

void emit_optimizer_state(MegatronEmission& e) {
  const OptimizerNumerics& o = e.p.optimizer;
  if (!o.precision_aware) return;
  e.flags << " --use-precision-aware-optimizer";
  if (o.main_params != Dtype::FP32) e.flags << " --main-params-dtype " << to_string(o.main_params);
  if (o.exp_avg != Dtype::FP32) e.flags << " --exp-avg-dtype " << to_string(o.exp_avg);
  if (o.exp_avg_sq != Dtype::FP32) e.flags << " --exp-avg-sq-dtype " << to_string(o.exp_avg_sq);
}

// ---- fp8 parameters and attention, fine-grained offloading ---------------------------------------------------------

// fp8 parameters only where they take effect: a low-precision recipe other than nvfp4 with sharded parameters.
bool fp8_param_gather(const Plan& p) {
  return p.fp8.param_gather && low_precision(p) && p.precision != Precision::NVFP4 &&
         p.optimizer_sharding != OptimizerSharding::None;
}

void read_fp8_options(MegatronReading& r) {
  if (r.f.on("--fp8-param-gather")) r.p.fp8.param_gather = true, r.p.assumed &= ~kFieldFp8ParamGather;
  if (r.f.on("--fp8-dot-product-attention")) r.p.fp8.attention = true, r.p.assumed &= ~kFieldFp8Attention;
}

void emit_fp8_options(MegatronEmission& e) {
  if (fp8_param_gather(e.p)) e.flags << " --fp8-param-gather";
  if (e.p.fp8.attention && low_precision(e.p)) e.flags << " --fp8-dot-product-attention";
}

// --offload-modules needs --fine-grained-activation-offloading and excludes --cpu-offloading (transformer_config.py).
void read_offload_modules(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  const bool on = f.on("--fine-grained-activation-offloading");
  const auto modules = f.list("--offload-modules");
  if (!on) {
    if (modules) r.l.notes.push_back("--offload-modules has no effect without --fine-grained-activation-offloading");
    if (f.has("--activation-offload-fraction"))
      r.l.notes.push_back("--activation-offload-fraction has no effect without --fine-grained-activation-offloading");
    return;
  }
  if (f.on("--cpu-offloading"))
    throw UserError("--fine-grained-activation-offloading contradicts --cpu-offloading (Megatron-LM offloads one way; give one)");
  static const std::set<std::string> unmodelled = {"fused_group_mlp", "gdp_qkv"};
  std::vector<std::string> known;
  for (const std::string& m : modules.value_or(std::vector<std::string>{})) {
    if (!unmodelled.count(m)) known.push_back(m);
    else r.l.notes.push_back("--offload-modules " + m + " is not modelled (lcplan keeps its input on the device)");
  }
  r.p.offload.modules = parse_modules(known, offload_module_names(), "--offload-modules");
  r.p.offload.modules_fraction = f.number("--activation-offload-fraction", 0, 1, "above 0, up to 1").value_or(1.0);
}

// ---- CUDA graphs ---------------------------------------------------------------------------------------------------

// --cuda-graph-impl, or the deprecated --enable-cuda-graph (local) and --external-cuda-graph (transformer_engine);
// --cuda-graph-modules or its deprecated alias --cuda-graph-scope, where "full" is the whole layer and
// "full_iteration" the full-iteration impl (arguments.py).
void read_cuda_graphs(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  f.on("--no-check-for-nan-in-loss-and-grad");  // what full-iteration graphs need; nothing lcplan models otherwise
  if (!has_flags(f, {"--cuda-graph-impl", "--cuda-graph-modules", "--cuda-graph-scope", "--enable-cuda-graph", "--external-cuda-graph"}))
    return;
  CudaGraphs& g = r.p.cuda_graphs;
  g = {};
  if (f.on("--enable-cuda-graph")) g.impl = GraphImpl::Local;
  if (f.on("--external-cuda-graph")) g.impl = GraphImpl::TransformerEngine;
  if (const auto impl = f.choice("--cuda-graph-impl", {"none", "local", "transformer_engine", "full_iteration"}))
    g.impl = parse_graph_impl(*impl);
  std::vector<std::string> names = f.list("--cuda-graph-modules").value_or(f.list("--cuda-graph-scope").value_or(std::vector<std::string>{}));
  std::vector<std::string> known;
  for (const std::string& n : names) {
    if (n == "full") continue;
    if (n == "full_iteration" || n == "full_iteration_inference") g.impl = GraphImpl::FullIteration;
    else if (n == "mamba") r.l.notes.push_back("--cuda-graph-modules mamba is not modelled (the zoo has no Mamba layers)");
    else known.push_back(n);
  }
  g.modules = parse_modules(known, graph_module_names(), "--cuda-graph-modules");
  if (g.impl == GraphImpl::None && g.modules) {
    r.l.notes.push_back("--cuda-graph-modules has no effect without --cuda-graph-impl");
    g.modules = 0;
  }
  r.p.assumed &= ~kFieldCudaGraphs;
}

void emit_cuda_graphs(MegatronEmission& e) {
  const CudaGraphs& g = e.p.cuda_graphs;
  if (g.impl == GraphImpl::None) return;
  e.flags << " --cuda-graph-impl " << to_string(g.impl);
  if (g.modules) e.flags << " --cuda-graph-modules " << join_words(module_list(g.modules, graph_module_names()));
  // A full-iteration graph cannot check the loss for NaN on the host (docs/user-guide/features/cuda_graph.md).
  if (g.impl == GraphImpl::FullIteration) e.flags << " --no-check-for-nan-in-loss-and-grad";
}

// ---- routing, router dtype, permutation ------------------------------------------------------------------------------

// Forced balance replaces the router's logits with random ones (moe_utils.py RandomSTE, "for benchmark only"); any
// balancing type routes the tokens where the router sends them, at the imbalance the calibration gives.
void read_routing(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  const auto types = f.list("--moe-router-load-balancing-type");
  static const std::set<std::string> valid = {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none"};
  for (const std::string& t : types.value_or(std::vector<std::string>{}))
    if (!valid.count(t))
      throw UserError("--moe-router-load-balancing-type \"" + t + "\" is not valid (valid: aux_loss, seq_aux_loss, "
                      "global_aux_loss, sinkhorn, quantile_balancing, none)");
  if (f.on("--moe-router-force-load-balancing")) {
    r.p.moe.routing = Routing::Forced;
    r.p.moe.routing_imbalance = 1;
    r.p.assumed &= ~(kFieldRouting | kFieldRoutingImbalance);
  } else if (types) {
    r.p.moe.routing = Routing::AuxLoss;
    r.p.assumed &= ~kFieldRouting;  // its imbalance: the calibration's (routing.aux_loss_imbalance)
  }
}

void emit_routing(MegatronEmission& e) {
  if (!e.moe) return;
  if (e.p.moe.routing == Routing::Forced) {
    e.flags << " --moe-router-force-load-balancing";
    return;
  }
  e.flags << " --moe-router-load-balancing-type aux_loss";
}

void read_router_dtype(MegatronReading& r) {
  if (const auto d = dtype_flag(r.f, "--moe-router-dtype", {Dtype::FP32, Dtype::FP64}))
    r.p.moe.router_dtype = *d, r.p.assumed &= ~kFieldRouterDtype;
}

// ---- overlap switches and context-parallel communication -------------------------------------------------------

void read_dp_overlap(MegatronReading& r) {
  if (!has_flags(r.f, {"--overlap-grad-reduce", "--overlap-param-gather"})) return;
  r.p.comm.overlap_grad_reduce = r.f.on("--overlap-grad-reduce");
  r.p.comm.overlap_param_gather = r.f.on("--overlap-param-gather");
  r.p.assumed &= ~kFieldDpOverlap;
}

void emit_dp_overlap(MegatronEmission& e) {
  if (e.p.comm.overlap_grad_reduce) e.flags << " --overlap-grad-reduce";
  if (e.p.comm.overlap_param_gather && e.p.optimizer_sharding != OptimizerSharding::None) e.flags << " --overlap-param-gather";
}

// --tp-comm-overlap needs --sequence-parallel (arguments.py).
void read_tp_overlap(MegatronReading& r) {
  if (!r.f.on("--tp-comm-overlap")) return;
  if (r.q.tp > 1 && !r.p.sequence_parallel)
    throw UserError("--tp-comm-overlap needs --sequence-parallel (Megatron-LM overlaps TP communication only with it; add it)");
  r.p.comm.tp_overlap = true;
  r.p.assumed &= ~kFieldTpOverlap;
}

// One --cp-comm-type for every layer (a per-layer list is read as its first type); a2a+p2p needs
// --hierarchical-context-parallel-sizes A P with A x P = cp (arguments.py).
void read_cp_comm(MegatronReading& r) {
  const auto types = r.f.list("--cp-comm-type");
  if (!types) return;
  for (const std::string& t : *types) parse_cp_comm(t == "all_gather" ? "allgather" : t);
  const std::string first = types->front() == "all_gather" ? "allgather" : types->front();
  r.p.comm.cp = parse_cp_comm(first);
  r.p.assumed &= ~kFieldCpComm;
  if (types->size() > 1 && std::any_of(types->begin(), types->end(), [&](const std::string& t) { return t != types->front(); }))
    r.l.notes.push_back("--cp-comm-type per layer (" + join_words(*types) + ") is modelled as " + first + " on every layer");
  if (r.p.comm.cp != CpComm::A2AP2P) return;
  const auto sizes = r.f.list("--hierarchical-context-parallel-sizes");
  const auto whole = [](const std::string& s) { return !s.empty() && s.size() < 7 && std::all_of(s.begin(), s.end(), ::isdigit); };
  if (!sizes || sizes->size() != 2 || !whole((*sizes)[0]) || !whole((*sizes)[1]) ||
      std::stoi((*sizes)[0]) * std::stoi((*sizes)[1]) != r.q.cp)
    throw UserError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P with A x P = "
                    "--context-parallel-size " + std::to_string(r.q.cp) + " (add it)");
  r.p.comm.cp_a2a_size = std::stoi((*sizes)[0]);
}

void emit_cp_comm(MegatronEmission& e) {
  const Plan& p = e.p;
  if (p.parallel.cp <= 1) return;
  e.flags << " --cp-comm-type " << to_string(p.comm.cp);
  if (p.comm.cp == CpComm::A2AP2P)
    e.flags << " --hierarchical-context-parallel-sizes " << p.comm.cp_a2a_size << " " << p.parallel.cp / std::max(1, p.comm.cp_a2a_size);
}

const char* on_off(bool v) { return v ? "on" : "off"; }

// ---- lcplan's own flags for these fields (estimate, search, report) -------------------------------------------------

const std::vector<Dtype> kMoments = {Dtype::FP32, Dtype::BF16, Dtype::FP16, Dtype::FP8};

std::vector<LcplanFlag> optimizer_state_flags() {
  return {{"--main-params-dtype", "master weights: fp32 or fp16 (precision-aware optimizer)",
           [](Plan& p, const std::string& t) {
             p.optimizer.main_params = parse_dtype(t, "--main-params-dtype", {Dtype::FP32, Dtype::FP16}), p.assumed &= ~kFieldOptimizerDtypes;
           }},
          {"--exp-avg-dtype", "Adam first moment: fp32, bf16, fp16 or fp8",
           [](Plan& p, const std::string& t) {
             p.optimizer.exp_avg = parse_dtype(t, "--exp-avg-dtype", kMoments), p.assumed &= ~kFieldOptimizerDtypes;
           }},
          {"--exp-avg-sq-dtype", "Adam second moment: fp32, bf16, fp16 or fp8",
           [](Plan& p, const std::string& t) {
             p.optimizer.exp_avg_sq = parse_dtype(t, "--exp-avg-sq-dtype", kMoments), p.assumed &= ~kFieldOptimizerDtypes;
           }},
          {"--precision-aware-optimizer", "on or off (Megatron --use-precision-aware-optimizer)",
           [](Plan& p, const std::string& t) {
             p.optimizer.precision_aware = parse_on_off(t, "--precision-aware-optimizer"), p.assumed &= ~kFieldOptimizerDtypes;
           }}};
}

std::vector<LcplanFlag> cuda_graph_flags() {
  return {{"--cuda-graphs", "none, local, transformer_engine or full_iteration",
           [](Plan& p, const std::string& t) { p.cuda_graphs.impl = parse_graph_impl(t), p.assumed &= ~kFieldCudaGraphs; }},
          {"--cuda-graph-modules", "captured modules: attn, mlp, moe, moe_router, moe_preprocess",
           [](Plan& p, const std::string& t) {
             p.cuda_graphs.modules = parse_modules(split_commas(t), graph_module_names(), "--cuda-graph-modules");
             p.assumed &= ~kFieldCudaGraphs;
           }}};
}

// --routing forced without --routing-imbalance means balanced (the imbalance flag, applied after, overrides).
void apply_routing_flag(Plan& p, const std::string& t) {
  p.moe.routing = parse_routing(t), p.assumed &= ~kFieldRouting;
  if (p.moe.routing == Routing::Forced) p.moe.routing_imbalance = 1, p.assumed &= ~kFieldRoutingImbalance;
}

std::vector<LcplanFlag> cp_comm_flags() {
  return {{"--cp-comm", "context-parallel communication: p2p, allgather, a2a or a2a+p2p",
           [](Plan& p, const std::string& t) { p.comm.cp = parse_cp_comm(t), p.assumed &= ~kFieldCpComm; }},
          {"--cp-a2a-size", "a2a+p2p: ranks of each all-to-all group",
           [](Plan& p, const std::string& t) { p.comm.cp_a2a_size = parse_positive_int(t, "--cp-a2a-size"); }}};
}

// Gradient and optimizer dtypes, fp8 parameters and attention, offloaded modules, CUDA graphs.
std::vector<MegatronRow> numerics_rows() {
  return {
      {.field = "optimizer.grad_dtype",
       .flags = {{"--accumulate-allreduce-grads-in-fp32", Arity::Switch, "grad_reduce_in_fp32"},
                 {"--grad-reduce-in-bf16", Arity::Switch}, {"--main-grads-dtype", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_grad_dtype,
       .emit = [](MegatronEmission& e) {
         e.flags << (e.p.optimizer.grad == Dtype::BF16 ? " --grad-reduce-in-bf16" : " --accumulate-allreduce-grads-in-fp32");
       },
       .expressed = [](const Plan& p, FieldValues& v) { add_value(v, "optimizer.grad_dtype", to_string(p.optimizer.grad)); },
       .lcplan = {{"--grad-dtype", "main gradients and their DP reduction: fp32 or bf16",
                   [](Plan& p, const std::string& t) {
                     p.optimizer.grad = parse_dtype(t, "--grad-dtype", {Dtype::FP32, Dtype::BF16}), p.assumed &= ~kFieldGradDtype;
                   }}}},
      {.field = "optimizer.precision_aware, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype",
       .flags = {{"--use-precision-aware-optimizer", Arity::Switch}, {"--main-params-dtype", Arity::One},
                 {"--exp-avg-dtype", Arity::One}, {"--exp-avg-sq-dtype", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_optimizer_state,
       .emit = emit_optimizer_state,
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "optimizer.precision_aware", on_off(p.optimizer.precision_aware));
         add_value(v, "optimizer.main_params_dtype", to_string(p.optimizer.main_params));
         add_value(v, "optimizer.exp_avg_dtype", to_string(p.optimizer.exp_avg));
         add_value(v, "optimizer.exp_avg_sq_dtype", to_string(p.optimizer.exp_avg_sq));
       },
       .lcplan = optimizer_state_flags()},
      {.field = "fp8.param_gather, fp8.attention",
       .flags = {{"--fp8-param-gather", Arity::Switch}, {"--fp8-dot-product-attention", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_fp8_options,
       .emit = emit_fp8_options,
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "fp8.param_gather", on_off(fp8_param_gather(p)));
         add_value(v, "fp8.attention", on_off(p.fp8.attention && low_precision(p)));
       },
       .lcplan = {{"--fp8-param-gather", "on or off: weights in fp8, all-gathered in fp8",
                    [](Plan& p, const std::string& t) {
                      p.fp8.param_gather = parse_on_off(t, "--fp8-param-gather"), p.assumed &= ~kFieldFp8ParamGather;
                    }},
                   {"--fp8-attention", "on or off: flash attention in fp8",
                    [](Plan& p, const std::string& t) {
                      p.fp8.attention = parse_on_off(t, "--fp8-attention"), p.assumed &= ~kFieldFp8Attention;
                    }}}},
      {.field = "offload.modules",
       .flags = {{"--fine-grained-activation-offloading", Arity::Switch}, {"--offload-modules", Arity::List},
                 {"--activation-offload-fraction", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_offload_modules,
       .emit = [](MegatronEmission& e) {
         if (e.p.offload.modules)
           e.flags << " --fine-grained-activation-offloading --offload-modules "
                   << join_words(module_list(e.p.offload.modules, offload_module_names()));
         if (e.p.offload.modules && e.p.offload.modules_fraction != 1.0)
           e.flags << " --activation-offload-fraction " << number_text(e.p.offload.modules_fraction);
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "offload.modules", module_text(p.offload.modules, offload_module_names()));
         add_value(v, "offload.modules_fraction", p.offload.modules_fraction);
       },
       .lcplan = {{"--offload-modules",
                    "modules whose input goes to the host: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act",
                    [](Plan& p, const std::string& t) {
                      p.offload.modules = parse_modules(split_commas(t), offload_module_names(), "--offload-modules");
                    }},
                   {"--offload-modules-fraction", "with --offload-modules: the share of their inputs moved to the host",
                    [](Plan& p, const std::string& t) {
                      p.offload.modules_fraction = parse_number(t, "--offload-modules-fraction", 0, 1, "above 0, up to 1");
                    }}}},
      {.field = "cuda_graphs",
       .flags = {{"--cuda-graph-impl", Arity::One}, {"--cuda-graph-modules", Arity::List}, {"--cuda-graph-scope", Arity::List},
                 {"--enable-cuda-graph", Arity::Switch}, {"--external-cuda-graph", Arity::Switch},
                 {"--no-check-for-nan-in-loss-and-grad", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_cuda_graphs,
       .emit = emit_cuda_graphs,
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "cuda_graphs.impl", to_string(p.cuda_graphs.impl));
         add_value(v, "cuda_graphs.modules", module_text(p.cuda_graphs.modules, graph_module_names()));
       },
       .lcplan = cuda_graph_flags()},
  };
}

// Routing, the router's dtype, permutation fusion, the DP / TP overlap switches, context-parallel communication.
std::vector<MegatronRow> moe_and_comm_rows() {
  return {
      {.field = "moe.routing",
       .flags = {{"--moe-router-force-load-balancing", Arity::Switch}, {"--moe-router-load-balancing-type", Arity::List}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_routing,
       .emit = emit_routing,
       .expressed = [](const Plan& p, FieldValues& v) { add_value(v, "moe.routing", to_string(p.moe.routing)); },
       .lcplan = {{"--routing", "MoE routing: forced (balanced) or aux_loss", apply_routing_flag}}},
      {.field = "moe.router_dtype",
       .flags = {{"--moe-router-dtype", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_router_dtype,
       .emit = [](MegatronEmission& e) {
         if (e.moe && e.p.moe.router_dtype != Dtype::BF16) e.flags << " --moe-router-dtype " << to_string(e.p.moe.router_dtype);
       },
       .expressed = [](const Plan& p, FieldValues& v) { add_value(v, "moe.router_dtype", to_string(p.moe.router_dtype)); },
       .lcplan = {{"--router-dtype", "MoE router logits: bf16, fp32 or fp64",
                   [](Plan& p, const std::string& t) {
                     p.moe.router_dtype = parse_dtype(t, "--router-dtype", {Dtype::BF16, Dtype::FP32, Dtype::FP64});
                     p.assumed &= ~kFieldRouterDtype;
                   }}}},
      {.field = "moe.permute_fusion",
       .flags = {{"--moe-permute-fusion", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         if (r.f.on("--moe-permute-fusion")) r.p.moe.permute_fusion = true, r.p.assumed &= ~kFieldPermuteFusion;
       },
       .emit = [](MegatronEmission& e) { if (e.moe && e.p.moe.permute_fusion) e.flags << " --moe-permute-fusion"; },
       .expressed = [](const Plan& p, FieldValues& v) { add_value(v, "moe.permute_fusion", on_off(p.moe.permute_fusion)); },
       .lcplan = {{"--permute-fusion", "on or off: fused MoE permutation",
                   [](Plan& p, const std::string& t) {
                     p.moe.permute_fusion = parse_on_off(t, "--permute-fusion"), p.assumed &= ~kFieldPermuteFusion;
                   }}}},
      {.field = "comm.overlap_grad_reduce, comm.overlap_param_gather",
       .flags = {{"--overlap-grad-reduce", Arity::Switch}, {"--overlap-param-gather", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_dp_overlap,
       .emit = emit_dp_overlap,
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "comm.overlap_grad_reduce", on_off(p.comm.overlap_grad_reduce));
         add_value(v, "comm.overlap_param_gather",
                   p.optimizer_sharding != OptimizerSharding::None ? on_off(p.comm.overlap_param_gather) : "-");
       },
       .lcplan = {{"--dp-overlap", "on or off: gradient reduce and parameter gather overlapped",
                    [](Plan& p, const std::string& t) {
                      p.comm.overlap_grad_reduce = p.comm.overlap_param_gather = parse_on_off(t, "--dp-overlap");
                      p.assumed &= ~kFieldDpOverlap;
                    }}}},
      {.field = "comm.tp_overlap",
       .flags = {{"--tp-comm-overlap", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_tp_overlap,
       .emit = [](MegatronEmission& e) {
         if (e.p.parallel.tp > 1 && e.p.sequence_parallel && e.p.comm.tp_overlap) e.flags << " --tp-comm-overlap";
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "comm.tp_overlap", p.parallel.tp > 1 && p.sequence_parallel ? on_off(p.comm.tp_overlap) : "-");
       },
       .lcplan = {{"--tp-overlap", "on or off: TP communication overlapped with GEMMs (userbuffers)",
                    [](Plan& p, const std::string& t) {
                      p.comm.tp_overlap = parse_on_off(t, "--tp-overlap"), p.assumed &= ~kFieldTpOverlap;
                    }}}},
      // Megatron-LM arguments.py: --hybrid-context-parallel asserts --calculate-per-token-loss.
      {.field = "hybrid_cp",
       .flags = {{"--hybrid-context-parallel", Arity::Switch}, {"--calculate-per-token-loss", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         r.p.hybrid_cp = r.f.on("--hybrid-context-parallel");
         if (r.p.hybrid_cp && !r.f.on("--calculate-per-token-loss"))
           throw UserError("--hybrid-context-parallel needs --calculate-per-token-loss (Megatron-LM asserts it; add it)");
       },
       .emit = [](MegatronEmission& e) { if (e.p.hybrid_cp) e.flags << " --hybrid-context-parallel --calculate-per-token-loss"; },
       .expressed = [](const Plan& p, FieldValues& v) { add_value(v, "hybrid_cp", on_off(p.hybrid_cp)); },
       .lcplan = {{"--hybrid-cp", "on or off: with --seq-lengths, split a sequence over only the CP ranks its length needs",
                   [](Plan& p, const std::string& t) { p.hybrid_cp = parse_on_off(t, "--hybrid-cp"); }}}},
      {.field = "comm.cp, comm.cp_a2a_size",
       .flags = {{"--cp-comm-type", Arity::List}, {"--hierarchical-context-parallel-sizes", Arity::List}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_cp_comm,
       .emit = emit_cp_comm,
       .expressed = [](const Plan& p, FieldValues& v) {
         add_value(v, "comm.cp", p.parallel.cp > 1 ? to_string(p.comm.cp) : "-");
         add_value(v, "comm.cp_a2a_size", p.parallel.cp > 1 && p.comm.cp == CpComm::A2AP2P ? p.comm.cp_a2a_size : 0);
       },
       .lcplan = cp_comm_flags()},
  };
}

// Settings whose effect lcplan does not model apart from what it already charges: each read with the sentence saying
// what lcplan assumes instead (megatron-settings.md sections 3, 4, 5 and 6 name them; none gives a size to cost).
const std::pair<const char*, const char*> kUnmodelled[] = {
    {"--overlap-param-gather-with-optimizer-step",
     "lcplan hides the distributed optimizer's parameter all-gather under the forward either way (the first bucket's "
     "wait, which this moves under the optimizer step, is not modelled)"},
    {"--optimizer-cuda-graph", "the optimizer step's host launches are part of time.step_overhead_seconds, not separated"},
    {"--ep-overlap-early-attn-memory-release",
     "lcplan charges EP overlap a whole layer of the paired microbatch; the attention memory released early is not sized"},
    {"--min-offloaded-tensor-size", "lcplan offloads every chosen module's input whatever its size"},
    {"--delay-offload-until-cuda-graph", "the offload's start does not move lcplan's copies, which run beside the passes"},
    {"--delta-offload-bytes-across-pp-ranks", "lcplan offloads the same share on every pipeline rank"},
    {"--reuse-grad-buf-for-mxfp8-param-ag", "lcplan counts mxfp8's bf16 parameter all-gather in the parameter buffer as "
                                           "it is; the gradient buffer's reuse is not modelled"},
};

void read_unmodelled(MegatronReading& r) {
  for (const auto& [flag, sentence] : kUnmodelled)
    if (r.f.has(flag)) r.l.notes.push_back(std::string(flag) + " is read without effect: " + sentence);
}

}  // namespace

std::vector<MegatronRow> run_setting_rows() {
  std::vector<MegatronRow> rows = numerics_rows();
  for (MegatronRow& r : moe_and_comm_rows()) rows.push_back(std::move(r));
  rows.push_back({.field = "(settings without a modelled effect)",
                  .flags = {{"--overlap-param-gather-with-optimizer-step", Arity::Switch},
                            {"--optimizer-cuda-graph", Arity::Switch},
                            {"--ep-overlap-early-attn-memory-release", Arity::Switch},
                            {"--min-offloaded-tensor-size", Arity::One},
                            {"--delay-offload-until-cuda-graph", Arity::Switch},
                            {"--delta-offload-bytes-across-pp-ranks", Arity::One},
                            {"--reuse-grad-buf-for-mxfp8-param-ag", Arity::Switch}},
                  .fidelity = Fidelity::Approximate,
                  .note = "read with a note saying what lcplan assumes instead",
                  .read = read_unmodelled});
  return rows;
}

}  // namespace lcplan
