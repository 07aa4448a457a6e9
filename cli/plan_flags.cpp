#include "cli/plan_flags.h"

#include <climits>
#include <cmath>

#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/hardware.h"

namespace lcplan::cli {

namespace {

// The run settings' flags (README "Records": the plan fields they set). Left out, a setting takes the
// implementation's default, which `estimate` names on its "defaults assumed" line.
void add_run_setting_flags(CLI::App* c, PlanFlags& f) {
  c->add_option("--grad-dtype", f.grad_dtype, "main gradients and their DP reduction: fp32 or bf16");
  c->add_option("--main-params-dtype", f.main_params_dtype, "master weights: fp32 or fp16 (precision-aware optimizer)");
  c->add_option("--exp-avg-dtype", f.exp_avg_dtype, "Adam first moment: fp32, bf16, fp16 or fp8");
  c->add_option("--exp-avg-sq-dtype", f.exp_avg_sq_dtype, "Adam second moment: fp32, bf16, fp16 or fp8");
  c->add_option("--precision-aware-optimizer", f.precision_aware, "on or off (Megatron --use-precision-aware-optimizer)");
  c->add_option("--fp8-recipe", f.fp8_recipe, "fp8 scaling: tensorwise, delayed or blockwise");
  c->add_option("--fp8-param-gather", f.fp8_param_gather, "on or off: weights in fp8, all-gathered in fp8");
  c->add_option("--fp8-attention", f.fp8_attention, "on or off: flash attention in fp8");
  c->add_option("--recompute-modules", f.recompute_modules,
                "selective recompute modules, comma-separated: core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts");
  c->add_option("--recompute-method", f.recompute_method, "full recompute: block (first N layers) or uniform (N layers per checkpoint)");
  c->add_option("--offload-fraction", f.offload_fraction, "with --offload-optimizer: the share of optimizer state on the host");
  c->add_option("--offload-modules", f.offload_modules,
                "modules whose input goes to the host: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act");
  c->add_option("--cuda-graphs", f.cuda_graphs, "none, local, transformer_engine or full_iteration");
  c->add_option("--cuda-graph-modules", f.cuda_graph_modules, "captured modules: attn, mlp, moe, moe_router, moe_preprocess");
  c->add_option("--routing", f.routing, "MoE routing: forced (balanced) or aux_loss");
  c->add_option("--router-dtype", f.router_dtype, "MoE router logits: bf16, fp32 or fp64");
  c->add_option("--permute-fusion", f.permute_fusion, "on or off: fused MoE permutation");
  c->add_option("--pad-to-capacity", f.pad_to_capacity, "on or off: token dropping pads experts to capacity");
  c->add_option("--dp-overlap", f.dp_overlap, "on or off: gradient reduce and parameter gather overlapped");
  c->add_option("--tp-overlap", f.tp_overlap, "on or off: TP communication overlapped with GEMMs (userbuffers)");
  c->add_option("--cp-comm", f.cp_comm, "context-parallel communication: p2p, allgather, a2a or a2a+p2p");
  c->add_option("--cp-a2a-size", f.cp_a2a_size, "a2a+p2p: ranks of each all-to-all group");
}

}  // namespace

void add_plan_flags(CLI::App* c, PlanFlags& f) {
  c->add_option("--plan", f.plan_file, "recipe.json to start from (flags override its values)");
  c->add_option("--megatron-args", f.megatron_args,
                "a Megatron-LM command line or its flags to start from (flags given to lcplan override it)");
  c->add_option("--megatron-args-file", f.megatron_args_file,
                "a Megatron-LM launch script (the pretrain_*.py / torchrun command is read) to start from");
  c->add_option("--model", f.model, "zoo name (see `lcplan models`) or path to a Hugging Face config.json");
  // The shipped profiles as the data folder holds them, so the help never lags behind data/hardware.
  std::string profiles;
  for (const std::string& n : hardware_names(data_dir())) profiles += (profiles.empty() ? "" : ", ") + n;
  c->add_option("--hardware", f.hardware, "hardware profile (data/hardware: " + profiles + "; default h100-sxm-80gb) or JSON path");
  c->add_option("--gpus", f.gpus, "total GPUs");
  c->add_option("--gpus-per-node", f.gpus_per_node, "GPUs per node / NVLink domain (default: the hardware profile's)");
  c->add_option("--seq", f.seq, "sequence length in tokens (131072, 128k, 1M)");
  c->add_option("--micro-batch", f.micro_batch, "sequences per microbatch");
  c->add_option("--global-batch", f.global_batch, "sequences per step (default: micro batch x dp x pp)");
  c->add_option("--precision", f.precision, "bf16, fp8, mxfp8 or nvfp4 (mxfp8/nvfp4 on Blackwell)");
  c->add_option("--tp", f.tp, "tensor parallel size");
  c->add_option("--pp", f.pp, "pipeline parallel size");
  c->add_option("--vpp", f.vpp, "virtual pipeline stages per rank");
  c->add_option("--cp", f.cp, "context parallel size");
  c->add_option("--ep", f.ep, "expert parallel size");
  c->add_option("--etp", f.etp, "expert tensor parallel size");
  c->add_flag("--no-sequence-parallel", f.no_sp, "disable Megatron sequence parallelism (tp > 1)");
  c->add_option("--optimizer-sharding", f.optimizer_sharding, "none, dist_opt (ZeRO-1) or fsdp (ZeRO-3)");
  c->add_flag("--fsdp", f.fsdp, "same as --optimizer-sharding fsdp");
  c->add_flag("--dist-opt", f.dist_opt, "same as --optimizer-sharding dist_opt");
  c->add_option("--recompute", f.recompute, "none, selective or full");
  c->add_option("--recompute-layers", f.recompute_layers, "full recompute: layers per virtual stage recomputed (0 = all)");
  c->add_flag("--offload-optimizer", f.offload_optimizer, "keep optimizer state in host memory");
  c->add_flag("--offload-activations", f.offload_activations, "keep saved activations in host memory");
  c->add_flag("--linear-ce", f.linear_ce_on, "stream the loss over the vocabulary instead of materializing logits");
  c->add_flag("--no-linear-ce", f.linear_ce_off, "materialize the logits before the loss");
  c->add_flag("--a2a-overlap", f.a2a_overlap,
              "overlap one microbatch's MoE all-to-all with another's compute (Megatron --overlap-moe-expert-parallel-comm)");
  c->add_option("--dispatcher", f.dispatcher, "MoE token dispatcher: alltoall (default), allgather, deepep or hybridep");
  c->add_option("--mtp-layers", f.mtp_layers, "multi-token-prediction modules trained (default: the model's)");
  c->add_option("--ep-chunks", f.ep_chunks, "chunked EP overlap: chunks per MoE layer (1 = no chunking)");
  c->add_option("--routing-imbalance", f.routing_imbalance, "busiest rank's routed tokens over the mean (1 = balanced)");
  c->add_option("--capacity-factor", f.capacity_factor, "token dropping capacity factor (0 = dropless)");
  add_run_setting_flags(c, f);
  c->add_option("--implementation", f.implementation,
                "the framework that runs the plan: megatron (default), megatron-bridge, bumblebee or lcplan-exec");
  c->add_option("--calibration", f.calibration,
                "calibration profile: default, a profile in data/calibration, or a JSON path (e.g. from lcplan profile)");
}

namespace {

std::string range_text(long long lo, long long hi) {
  return hi == INT_MAX ? std::to_string(lo) + " or more" : std::to_string(lo) + " to " + std::to_string(hi);
}

}  // namespace

int parse_int_in(const std::string& text, const std::string& flag, int lo, int hi) {
  const std::string valid = " (valid: a whole number, " + range_text(lo, hi) + ")";
  const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
  if (sign == text.size()) throw UserError(flag + " \"" + text + "\" is not a whole number" + valid);
  for (size_t i = sign; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') throw UserError(flag + " \"" + text + "\" is not a whole number" + valid);
  // More than 10 digits cannot be an int; checking the length first keeps stoll away from overflow.
  const bool huge = text.size() - sign > 10;
  const long long v = huge ? (sign ? LLONG_MIN : LLONG_MAX) : std::stoll(text);
  if (v > hi && hi == INT_MAX) throw UserError(flag + " \"" + text + "\" is too large (valid: at most " + std::to_string(hi) + ")");
  if (v < lo || v > hi) throw UserError(flag + " \"" + text + "\" is out of range" + valid);
  return int(v);
}

int parse_positive_int(const std::string& text, const std::string& flag) { return parse_int_in(text, flag, 1, INT_MAX); }

std::vector<int> parse_int_list(const std::string& text, const std::string& flag, int lo) {
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    if (item.empty())
      throw UserError(flag + " \"" + text + "\" has an empty entry (valid: whole numbers, " + range_text(lo, INT_MAX) +
                      ", comma-separated, e.g. 4,8)");
    out.push_back(parse_int_in(item, flag, lo, INT_MAX));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double parse_number(const std::string& text, const std::string& flag, double lo, double hi, const std::string& valid) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    throw UserError(flag + " \"" + text + "\" is not a number (valid: " + valid + ")");
  if (v < lo || v > hi) throw UserError(flag + " \"" + text + "\" is out of range (valid: " + valid + ")");
  return v;
}

std::string optimizer_sharding_flag(const PlanFlags& f) {
  std::string v = f.optimizer_sharding;
  auto set = [&](const char* name, const char* flag) {
    if (!v.empty() && v != name)
      throw UserError(std::string(flag) + " contradicts --optimizer-sharding " + v + " (give one of them)");
    v = name;
  };
  if (f.fsdp) set("fsdp", "--fsdp");
  if (f.dist_opt) set("dist_opt", "--dist-opt");
  return v;
}

namespace {

int single(const std::string& text, const std::string& flag, bool allow_lists, int lo = 1) {
  const auto list = parse_int_list(text, flag, lo);
  if (list.size() != 1 && !allow_lists)
    throw UserError(flag + " \"" + text + "\" gives several values; estimate takes one (use `lcplan search` to compare)");
  return list.front();
}

}  // namespace

Plan plan_from_flags(const PlanFlags& f, bool allow_lists) {
  Plan p;
  p.assumed = kPlanDefaultFields;  // what no flag sets takes the implementation's defaults
  if (!f.plan_file.empty()) p = load_plan_file(f.plan_file);
  return apply_plan_flags(p, f, allow_lists);
}

namespace {

bool on_off(const std::string& text, const std::string& flag) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw UserError(flag + " \"" + text + "\" is not valid (valid: on, off)");
}

std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// Sets `member` from `text` through `parse` and marks `field` as given.
template <typename T, typename F>
void given(Plan& p, const std::string& text, uint32_t field, T& member, F parse) {
  if (text.empty()) return;
  member = parse(text);
  p.assumed &= ~field;
}

void apply_optimizer_and_precision_flags(Plan& p, const PlanFlags& f) {
  given(p, f.grad_dtype, kFieldGradDtype, p.optimizer.grad,
        [](const std::string& t) { return parse_dtype(t, "--grad-dtype", {Dtype::FP32, Dtype::BF16}); });
  OptimizerNumerics& o = p.optimizer;
  given(p, f.main_params_dtype, kFieldOptimizerDtypes, o.main_params,
        [](const std::string& t) { return parse_dtype(t, "--main-params-dtype", {Dtype::FP32, Dtype::FP16}); });
  const std::vector<Dtype> moments = {Dtype::FP32, Dtype::BF16, Dtype::FP16, Dtype::FP8};
  given(p, f.exp_avg_dtype, kFieldOptimizerDtypes, o.exp_avg, [&](const std::string& t) { return parse_dtype(t, "--exp-avg-dtype", moments); });
  given(p, f.exp_avg_sq_dtype, kFieldOptimizerDtypes, o.exp_avg_sq,
        [&](const std::string& t) { return parse_dtype(t, "--exp-avg-sq-dtype", moments); });
  given(p, f.precision_aware, kFieldOptimizerDtypes, o.precision_aware,
        [](const std::string& t) { return on_off(t, "--precision-aware-optimizer"); });
  given(p, f.fp8_recipe, kFieldFp8Recipe, p.fp8.recipe, [](const std::string& t) { return parse_fp8_recipe(t); });
  given(p, f.fp8_param_gather, kFieldFp8ParamGather, p.fp8.param_gather, [](const std::string& t) { return on_off(t, "--fp8-param-gather"); });
  given(p, f.fp8_attention, kFieldFp8Attention, p.fp8.attention, [](const std::string& t) { return on_off(t, "--fp8-attention"); });
}

void apply_run_setting_flags(Plan& p, const PlanFlags& f) {
  apply_optimizer_and_precision_flags(p, f);
  if (!f.recompute_modules.empty())
    p.recompute_modules = parse_modules(comma_list(f.recompute_modules), recompute_module_names(), "--recompute-modules");
  if (!f.recompute_method.empty()) p.recompute_method = parse_recompute_method(f.recompute_method);
  if (!f.offload_fraction.empty())
    p.offload.optimizer_fraction = parse_number(f.offload_fraction, "--offload-fraction", 0, 1, "above 0, up to 1");
  if (!f.offload_modules.empty())
    p.offload.modules = parse_modules(comma_list(f.offload_modules), offload_module_names(), "--offload-modules");
  given(p, f.cuda_graphs, kFieldCudaGraphs, p.cuda_graphs.impl, [](const std::string& t) { return parse_graph_impl(t); });
  if (!f.cuda_graph_modules.empty()) {
    p.cuda_graphs.modules = parse_modules(comma_list(f.cuda_graph_modules), graph_module_names(), "--cuda-graph-modules");
    p.assumed &= ~kFieldCudaGraphs;
  }
  given(p, f.routing, kFieldRouting, p.moe.routing, [](const std::string& t) { return parse_routing(t); });
  if (!f.routing.empty() && p.moe.routing == Routing::Forced && f.routing_imbalance.empty())
    p.moe.routing_imbalance = 1, p.assumed &= ~kFieldRoutingImbalance;
  given(p, f.router_dtype, kFieldRouterDtype, p.moe.router_dtype,
        [](const std::string& t) { return parse_dtype(t, "--router-dtype", {Dtype::BF16, Dtype::FP32, Dtype::FP64}); });
  given(p, f.permute_fusion, kFieldPermuteFusion, p.moe.permute_fusion, [](const std::string& t) { return on_off(t, "--permute-fusion"); });
  given(p, f.pad_to_capacity, kFieldPadToCapacity, p.moe.pad_to_capacity, [](const std::string& t) { return on_off(t, "--pad-to-capacity"); });
  if (!f.dp_overlap.empty()) {
    p.comm.overlap_grad_reduce = p.comm.overlap_param_gather = on_off(f.dp_overlap, "--dp-overlap");
    p.assumed &= ~kFieldDpOverlap;
  }
  given(p, f.tp_overlap, kFieldTpOverlap, p.comm.tp_overlap, [](const std::string& t) { return on_off(t, "--tp-overlap"); });
  given(p, f.cp_comm, kFieldCpComm, p.comm.cp, [](const std::string& t) { return parse_cp_comm(t); });
  if (!f.cp_a2a_size.empty()) p.comm.cp_a2a_size = parse_positive_int(f.cp_a2a_size, "--cp-a2a-size");
}

}  // namespace

Plan apply_plan_flags(Plan p, const PlanFlags& f, bool allow_lists) {
  if (!f.model.empty()) p.model = f.model;
  if (!f.hardware.empty()) p.hardware = f.hardware;
  if (!f.gpus.empty()) p.gpus = parse_positive_int(f.gpus, "--gpus");
  if (!f.gpus_per_node.empty()) p.gpus_per_node = parse_positive_int(f.gpus_per_node, "--gpus-per-node");
  if (!f.seq.empty()) p.seq_len = parse_size(f.seq, "--seq");
  if (!f.global_batch.empty()) p.global_batch = parse_positive_int(f.global_batch, "--global-batch");
  if (!f.precision.empty()) p.precision = parse_precision(f.precision);
  if (!f.implementation.empty()) p.implementation = f.implementation;
  // List-capable dimensions: take the first value; the search replaces them with its own choices.
  if (!f.micro_batch.empty()) p.micro_batch = single(f.micro_batch, "--micro-batch", allow_lists);
  if (!f.tp.empty()) p.parallel.tp = single(f.tp, "--tp", allow_lists);
  if (!f.pp.empty()) p.parallel.pp = single(f.pp, "--pp", allow_lists);
  if (!f.vpp.empty()) p.parallel.vpp = single(f.vpp, "--vpp", allow_lists);
  if (!f.cp.empty()) p.parallel.cp = single(f.cp, "--cp", allow_lists);
  if (!f.ep.empty()) p.parallel.ep = single(f.ep, "--ep", allow_lists);
  if (!f.etp.empty()) p.parallel.etp = single(f.etp, "--etp", allow_lists);
  if (!f.ep_chunks.empty()) p.moe.ep_chunks = single(f.ep_chunks, "--ep-chunks", allow_lists);
  if (!f.recompute_layers.empty()) p.recompute_layers = single(f.recompute_layers, "--recompute-layers", allow_lists, 0);
  if (f.no_sp) p.sequence_parallel = false;
  const std::string sharding = optimizer_sharding_flag(f);
  if (!sharding.empty() && sharding.find(',') == std::string::npos) p.optimizer_sharding = parse_optimizer_sharding(sharding);
  else if (!sharding.empty() && !allow_lists)
    throw UserError("--optimizer-sharding \"" + sharding + "\" gives several values; estimate takes one");
  if (!f.recompute.empty() && f.recompute.find(',') == std::string::npos) p.recompute = parse_recompute(f.recompute);
  else if (!f.recompute.empty() && !allow_lists)
    throw UserError("--recompute \"" + f.recompute + "\" gives several values; estimate takes one");
  if (f.offload_optimizer) p.offload.optimizer = true;
  if (f.offload_activations) p.offload.activations = true;
  if (f.linear_ce_on && f.linear_ce_off) throw UserError("--linear-ce contradicts --no-linear-ce (give one of them)");
  if (f.linear_ce_on) p.linear_ce = true;
  if (f.linear_ce_off) p.linear_ce = false;
  if (f.a2a_overlap) p.moe.a2a_overlap = true;
  if (!f.dispatcher.empty()) p.moe.dispatcher = parse_dispatcher(f.dispatcher), p.assumed &= ~kFieldDispatcher;
  apply_run_setting_flags(p, f);
  if (!f.mtp_layers.empty()) p.mtp_layers = single(f.mtp_layers, "--mtp-layers", false, 0);
  // The ranges are the plan rules' (check_plan words them for plan files too); here only "is it a number".
  if (!f.routing_imbalance.empty()) {
    p.moe.routing_imbalance = parse_number(f.routing_imbalance, "--routing-imbalance", -HUGE_VAL, HUGE_VAL, "1 to 64, 1 = balanced");
    if (p.assumed & kFieldRouting) p.moe.routing = p.moe.routing_imbalance > 1 ? Routing::AuxLoss : Routing::Forced;
    p.assumed &= ~(kFieldRouting | kFieldRoutingImbalance);
  }
  if (!f.capacity_factor.empty())
    p.moe.capacity_factor = parse_number(f.capacity_factor, "--capacity-factor", -HUGE_VAL, HUGE_VAL, "0 = dropless, or up to 64");
  // A plan file that gives the field as 0 is told so: "use --seq" would not say what is wrong with the file.
  const std::string in_file = f.plan_file.empty() ? "" : f.plan_file + " gives ";
  if (p.model.empty()) throw UserError("no model given (use --model NAME or --plan recipe.json; `lcplan models` lists the zoo)");
  if (p.gpus == 0)
    throw UserError(in_file.empty() ? "no GPU count given (use --gpus N)"
                                    : in_file + "no GPU count (\"gpus\" absent or 0; valid: 1 or more, or use --gpus N)");
  if (p.seq_len == 0)
    throw UserError(in_file.empty() ? "no sequence length given (use --seq, e.g. --seq 128k)"
                                    : in_file + "no sequence length (\"seq_len\" absent or 0; valid: tokens per sequence "
                                                "such as 131072 or \"128k\", or use --seq)");
  return p;
}

Inputs load_inputs(Plan& plan, const std::string& calibration_override, const std::optional<ModelSpec>& model, bool search) {
  InputChoices c;
  if (!calibration_override.empty()) c.calibration = calibration_override;
  c.model = model;
  c.search = search;
  Inputs in = load_plan_inputs(plan, data_dir(), c);
  check_plan_inputs(in, plan, /*rules=*/false);  // estimate checks the rules itself; a search's plan is not chosen yet
  return in;
}

}  // namespace lcplan::cli
