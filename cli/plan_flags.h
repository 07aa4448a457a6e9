// Plan flags shared by `lcplan estimate` (one value each) and `lcplan search` (a value pins a dimension,
// a comma list restricts it, absence leaves it free).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/flag_text.h"
#include "estimator/plan.h"
#include "estimator/plan_inputs.h"
#include "models/model_spec.h"

namespace lcplan::cli {

struct PlanFlags {
  std::string plan_file;      // --plan recipe.json (flags given on the command line override its values)
  std::string megatron_args, megatron_args_file;  // a Megatron-LM launch to start from instead (search/megatron_args.h)
  std::string model, hardware, seq, precision, optimizer_sharding, recompute, implementation, calibration;
  std::string gpus, gpus_per_node, micro_batch, global_batch;
  std::string tp, pp, vpp, cp, ep, etp, ep_chunks, recompute_layers;  // "8" or, for search, "8,16"
  std::string routing_imbalance, capacity_factor;
  std::string mtp_layers, dispatcher;
  // Run settings (estimator/run_settings.h) by flag name ("--grad-dtype"): the flag rows' lcplan flags.
  std::map<std::string, std::string> run_settings;
  bool linear_ce_on = false, linear_ce_off = false;
  bool a2a_overlap = false;  // neither: estimate keeps the plan's value, search tries both
  bool fsdp = false, dist_opt = false, no_sp = false, offload_optimizer = false, offload_activations = false;
};

void add_plan_flags(CLI::App* cmd, PlanFlags& f);

// Value parsers for flags (common/flag_text.h), also spelled cli::parse_number and so on.
using lcplan::parse_int_in;
using lcplan::parse_int_list;
using lcplan::parse_number;
using lcplan::parse_positive_int;

// Resolves --fsdp / --dist-opt / --optimizer-sharding into one value ("" when none given); contradictions throw.
std::string optimizer_sharding_flag(const PlanFlags& f);

// The base plan: --plan file (if any) with every single-valued flag applied on top. List-valued flags are
// rejected unless `allow_lists` (search applies them itself).
Plan plan_from_flags(const PlanFlags& f, bool allow_lists);
// The flags applied on top of a plan, then the checks that a model, a GPU count and a sequence length are known.
Plan apply_plan_flags(Plan p, const PlanFlags& f, bool allow_lists);

// The plan's inputs (estimator/plan_inputs.h) from data_dir(), --calibration (empty: the default profile) and a model
// already built (Megatron shape flags); fills plan.gpus_per_node from the hardware profile when the plan leaves it 0
// and the run settings it left unset from its implementation (`search`: the framework's recommended switches).
using Inputs = PlanInputs;
Inputs load_inputs(Plan& plan, const std::string& calibration_override, const std::optional<ModelSpec>& model = {},
                   bool search = false);
// The line an estimate or search prints when the profile's time band does not cover the plan's framework ("" if it does).
std::string band_note(const Inputs& in, const std::string& implementation);

// What a command starts from: plan_from_flags, or a Megatron-LM launch (--megatron-args / --megatron-args-file)
// read for its model (--model, else the launch's shape flags) and GPU count (--gpus, else WORLD_SIZE or
// --nnodes x --nproc-per-node), with every other plan flag applied on top (cli/megatron_input.cpp).
struct StartingPoint {
  Plan plan;
  std::optional<ModelSpec> model;     // the model, when already loaded or built from flags
  std::vector<std::string> warnings;  // lines for stderr: ignored flags, flags read approximately
  bool from_megatron = false;
  bool global_batch_given = true;     // false: the launch left --global-batch-size at Megatron's default
};
StartingPoint starting_point(const PlanFlags& f, bool allow_lists);
// A command that saves the plan or loads its model again (search --out, tune) needs a model lcplan can load by
// name: a Megatron-LM launch read without --model describes it only by shape flags. Throws one UserError sentence
// naming `why` then, before any work.
void require_loadable_model(const PlanFlags& f, const std::string& why);

// Prints the warnings, one "lcplan: warning: ..." line each, on stderr.
void print_warnings(const StartingPoint& s);

}  // namespace lcplan::cli
