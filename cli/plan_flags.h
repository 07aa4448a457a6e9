// Plan flags shared by `lcplan estimate` (one value each) and `lcplan search` (a value pins a dimension,
// a comma list restricts it, absence leaves it free).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "estimator/plan.h"

namespace lcplan::cli {

struct PlanFlags {
  std::string plan_file;      // --plan recipe.json (flags given on the command line override its values)
  std::string model, hardware, seq, precision, optimizer_sharding, recompute, implementation, calibration;
  std::string gpus, gpus_per_node, micro_batch, global_batch;
  std::string tp, pp, vpp, cp, ep, etp, ep_chunks, recompute_layers;  // "8" or, for search, "8,16"
  std::string routing_imbalance, capacity_factor;
  std::string mtp_layers, dispatcher;
  bool linear_ce_on = false, linear_ce_off = false;
  bool a2a_overlap = false;  // neither: estimate keeps the plan's value, search tries both
  bool fsdp = false, dist_opt = false, no_sp = false, offload_optimizer = false, offload_activations = false;
};

void add_plan_flags(CLI::App* cmd, PlanFlags& f);

// Value parsers for flags. Bad input throws one UserError sentence in one format for every flag:
//   <flag> "<text>" is not a whole number|not a number|out of range (valid: <what>)
int parse_int_in(const std::string& text, const std::string& flag, int lo, int hi);
int parse_positive_int(const std::string& text, const std::string& flag);  // 1 or more
// Comma list ("8" or "4,8,16") of whole numbers of at least `lo`.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag, int lo = 1);
// A finite number in [lo, hi]; `valid` words the range for the message ("0 to 1").
double parse_number(const std::string& text, const std::string& flag, double lo, double hi, const std::string& valid);

// Resolves --fsdp / --dist-opt / --optimizer-sharding into one value ("" when none given); contradictions throw.
std::string optimizer_sharding_flag(const PlanFlags& f);

// The base plan: --plan file (if any) with every single-valued flag applied on top. List-valued flags are
// rejected unless `allow_lists` (search applies them itself).
Plan plan_from_flags(const PlanFlags& f, bool allow_lists);

}  // namespace lcplan::cli

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "models/model_spec.h"

namespace lcplan::cli {

// Everything a plan refers to by name, loaded from the zoo and data/.
struct Inputs {
  ModelSpec model;
  Hardware hardware;
  Calibration calibration;  // the profile resolved for the plan's hardware and implementation
  Calibration profile;      // the profile as loaded (bands, overrides for other hardware)
};
// Also fills plan.gpus_per_node from the hardware profile when the plan leaves it at 0.
Inputs load_inputs(Plan& plan, const std::string& calibration_override);

}  // namespace lcplan::cli
