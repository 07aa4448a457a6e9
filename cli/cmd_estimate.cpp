// lcplan estimate: memory and time of one plan, term by term.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/batch_flags.h"
#include "cli/plan_flags.h"
#include "estimator/estimate.h"
#include "estimator/packing.h"
#include "estimator/plan_rules.h"
#include "search/megatron_flags.h"
#include "common/json_file.h"

namespace lcplan::cli {

namespace {

struct EstimateArgs {
  PlanFlags plan;
  bool json = false;
  std::string out;
  BatchFlags batches;
};
}  // namespace

void register_estimate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EstimateArgs>();
  auto* cmd = app.add_subcommand("estimate", "per-GPU peak memory (per stage, term by term) and step time of one plan");
  add_plan_flags(cmd, args->plan);
  cmd->add_flag("--json", args->json, "print the estimate record as JSON");
  cmd->add_option("--out", args->out, "also write the estimate record (JSON) to this file");
  add_batch_flags(cmd, args->batches);
  cmd->callback([args, &exit_code]() {
    const std::optional<LengthDistribution> dist = read_batch_lengths(args->batches, args->plan);
    StartingPoint start = starting_point(args->plan, /*allow_lists=*/false);
    Plan& plan = start.plan;
    const Inputs in = load_inputs(plan, args->plan.calibration, start.model);
    std::optional<BatchRecord> batches;
    if (prepare_batches(args->batches, dist, in.model, plan)) batches = estimate_batch_record(in, plan);
    else require_valid_plan(in.model, plan);
    const Estimate e = batches ? batches->batches.worst_estimate : estimate(in.model, plan, in.hardware, in.calibration);
    const Plan& shown = batches ? batches->batches.worst_plan : plan;
    const std::string record = (batches ? batches->record : estimate_to_json(e, plan)).dump(2) + "\n";
    if (!args->out.empty()) write_file_atomic(args->out, record);
    print_warnings(start);
    if (args->json) {
      std::fputs(record.c_str(), stdout);
    } else {
      // Under the run header, one line naming the run settings the plan left to its implementation and their values.
      std::string table = estimate_table(e, shown, in.model, in.hardware);
      if (!in.assumed.empty())
        table.insert(table.find('\n') + 1,
                     "defaults assumed (" + plan.implementation + "): " + join_words(in.assumed, ", ") + "\n");
      if (batches) {
        const BatchEstimate& b = batches->batches;
        table.insert(table.find('\n') + 1, "the tables below: every microbatch like the fullest one drawn (" +
                                                std::to_string(b.worst.lengths.size()) + " packed, " +
                                                std::to_string(b.worst.tokens) + " tokens); the drawn batches follow them\n");
        table += "\n" + batch_estimate_table(b, plan.batches->lengths, plan.batches->packing);
      }
      // The error band measures a new model on a framework the fit knew; one no fitted row ran keeps its priors.
      table += band_note(in, plan.implementation);
      // A new user's first plan often does not fit: name the command that finds one that does.
      if (!e.fits_at_estimate)
        table += "hint: lcplan search with the same --model, --gpus, --hardware and --seq (or --seq-lengths) lists the "
                 "layouts that fit, fastest first\n";
      std::fputs(table.c_str(), stdout);
    }
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
