#include "cli/plan_flags.h"

#include <climits>
#include <cmath>
#include <string_view>

#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/frameworks.h"
#include "estimator/hardware.h"
#include "search/megatron_flags.h"

namespace lcplan::cli {

namespace {

// The run settings' flags, one per flag row that has one (search/megatron_flags.h: the row that reads and emits the
// field's Megatron flags gives its lcplan flag too). Left out, a setting takes the implementation's default, which
// `estimate` names on its "defaults assumed" line.
// A switch ("on or off") given bare means on.
void add_run_setting_flags(CLI::App* c, PlanFlags& f) {
  for (const MegatronRow& row : megatron_rows())
    for (const LcplanFlag& flag : row.lcplan) {
      CLI::Option* o = c->add_option(flag.name, f.run_settings[flag.name], flag.help);
      if (std::string_view(flag.help).starts_with("on or off")) o->expected(0, 1)->default_str("on");
    }
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

// Every run-setting flag given, in table order.
void apply_run_setting_flags(Plan& p, const PlanFlags& f) {
  for (const MegatronRow& row : megatron_rows())
    for (const LcplanFlag& flag : row.lcplan)
      if (const auto it = f.run_settings.find(flag.name); it != f.run_settings.end() && !it->second.empty()) flag.apply(p, it->second);
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

// The error band measures a new model on a framework the fit knew (validation.time.frameworks).
std::string band_note(const Inputs& in, const std::string& implementation) {
  const ErrorBand& b = in.profile.time_band;
  if (b.points == 0 || b.covers(calibration_key(implementation))) return "";
  return "note: the error band measures new models on " + join_words(b.frameworks, ", ") + ", not on " + implementation +
         ", whose framework coefficients no fitted run of another model checked\n";
}

}  // namespace lcplan::cli
