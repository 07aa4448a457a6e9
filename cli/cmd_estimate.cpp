// lcplan estimate: memory and time of one plan, term by term.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "common/json_file.h"

namespace lcplan::cli {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

struct EstimateArgs {
  PlanFlags plan;
  bool json = false;
  std::string out;
};
}  // namespace

void register_estimate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EstimateArgs>();
  auto* cmd = app.add_subcommand("estimate", "per-GPU peak memory (per stage, term by term) and step time of one plan");
  add_plan_flags(cmd, args->plan);
  cmd->add_flag("--json", args->json, "print the estimate record as JSON");
  cmd->add_option("--out", args->out, "also write the estimate record (JSON) to this file");
  cmd->callback([args, &exit_code]() {
    StartingPoint start = starting_point(args->plan, /*allow_lists=*/false);
    Plan& plan = start.plan;
    const Inputs in = load_inputs(plan, args->plan.calibration, start.model);
    require_valid_plan(in.model, plan);
    const Estimate e = estimate(in.model, plan, in.hardware, in.calibration);
    const std::string record = estimate_to_json(e, plan).dump(2) + "\n";
    if (!args->out.empty()) write_file_atomic(args->out, record);
    print_warnings(start);
    if (args->json) {
      std::fputs(record.c_str(), stdout);
    } else {
      // Under the run header, one line naming the run settings the plan left to its implementation and their values.
      std::string table = estimate_table(e, plan, in.model, in.hardware);
      if (!in.assumed.empty())
        table.insert(table.find('\n') + 1, "defaults assumed (" + plan.implementation + "): " + join(in.assumed) + "\n");
      std::fputs(table.c_str(), stdout);
    }
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
