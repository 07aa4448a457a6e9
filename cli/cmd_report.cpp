// lcplan report: one self-contained HTML page for a plan (estimate flags or --plan) or a search (--search), with
// measured runs beside the predictions (--measured).
#include <cstdio>
#include <memory>

#include "cli/batch_flags.h"
#include "cli/commands.h"
#include "cli/search_flags.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "report/html_report.h"
#include "search/emit.h"

namespace lcplan::cli {

namespace {

struct ReportArgs {
  PlanFlags plan;
  SearchFlags search;
  bool is_search = false;
  std::string measured, out;
  BatchFlags batches;
};

// Without --search a report draws one plan: a list-valued flag gets a sentence that names --search.
void require_single_values(const PlanFlags& f) {
  const std::pair<const std::string&, const char*> lists[] = {
      {f.tp, "--tp"},   {f.pp, "--pp"},   {f.vpp, "--vpp"}, {f.cp, "--cp"}, {f.ep, "--ep"},
      {f.etp, "--etp"}, {f.micro_batch, "--micro-batch"}, {f.ep_chunks, "--ep-chunks"},
      {f.recompute_layers, "--recompute-layers"}, {f.recompute, "--recompute"}, {f.optimizer_sharding, "--optimizer-sharding"}};
  for (const auto& [text, flag] : lists)
    if (text.find(',') != std::string::npos)
      throw UserError(std::string(flag) + " \"" + text + "\" gives several values; a report without --search draws one plan "
                      "(add --search to compare plans)");
}

// The command line as given, for the page's header: subcommand flags in the order CLI11 registered them.
std::string command_text(const CLI::App* cmd) {
  std::string s = "lcplan report";
  for (const CLI::Option* o : cmd->get_options()) {
    if (o->count() == 0 || o->get_name() == "--help") continue;
    s += " " + o->get_name();
    if (o->get_items_expected_min() > 0)
      for (const std::string& r : o->results()) s += " " + r;
  }
  return s;
}

}  // namespace

void register_report(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand("report", "write a self-contained HTML report of a plan (or, with --search, of a search)");
  add_plan_flags(cmd, a->plan);
  cmd->add_flag("--search", a->is_search, "report a search (plan flags pin or restrict it) instead of one plan");
  add_search_flags(cmd, a->search);
  cmd->add_option("--measured", a->measured, "measurements JSON (lcplan calibrate's format): drawn beside the prediction for the same plan");
  cmd->add_option("--out", a->out, "the HTML file to write (e.g. report.html)")->required();
  add_batch_flags(cmd, a->batches);
  cmd->callback([a, cmd, &exit_code]() {
    ReportInput in;
    const std::optional<LengthDistribution> dist = read_batch_lengths(a->batches, a->plan);
    if (dist && a->is_search) {
      BatchSearchRun run = run_batch_search(a->plan, a->search, a->batches, *dist);
      print_warnings(run.setup.start);
      if (run.result.top.empty())
        throw UserError("no plan fits its fullest microbatch over --seq-lengths (lcplan search --seq-lengths prints the "
                        "table; valid: more GPUs, a smaller --tokens-per-microbatch, or shorter sequences)");
      in.batch_search = batch_search_json(run.result);
      in.estimate = estimate_batch_record(run.setup.in, run.result.top.front().plan).record;
      in.model = std::move(run.setup.in.model);
      in.hardware = std::move(run.setup.in.hardware);
    } else if (a->is_search) {
      SearchRun run = run_search(a->plan, a->search);
      in.search = search_json(run.result, run.recipe);
      in.estimate = in.search.at("top").at(0);
      in.model = std::move(run.in.model);
      in.hardware = std::move(run.in.hardware);
    } else {
      if (const auto given = given_search_flags(a->search); !given.empty())
        throw UserError(given.front() + " applies only with --search (add --search or drop " + given.front() + ")");
      require_single_values(a->plan);
      // The same starting point as estimate: --plan, or a Megatron-LM launch (--megatron-args / -file) with its model.
      StartingPoint start = starting_point(a->plan, /*allow_lists=*/false);
      Plan& plan = start.plan;
      Inputs inputs = load_inputs(plan, a->plan.calibration, start.model);
      if (prepare_batches(a->batches, dist, inputs.model, plan)) {
        in.estimate = estimate_batch_record(inputs, plan).record;
      } else {
        require_valid_plan(inputs.model, plan);
        in.estimate = estimate_to_json(estimate(inputs.model, plan, inputs.hardware, inputs.calibration), plan);
      }
      print_warnings(start);
      in.model = std::move(inputs.model);
      in.hardware = std::move(inputs.hardware);
    }
    if (!a->measured.empty()) {
      in.measured = measured_runs_from_json(read_json_file(a->measured, "measurements file"), a->measured);
      if (matched_measured_runs(in) == 0)
        throw UserError("none of the " + std::to_string(in.measured.size()) + " measured runs in " + a->measured +
                        " is for a plan the report draws (a run's plan must match one field by field; the plan drawn "
                        "is " + plan_to_json(plan_from_json(in.estimate.at("plan"))).dump() + ")");
    }
    in.command = command_text(cmd);
    write_file_atomic(a->out, report_html(in));
    std::printf("wrote %s\n", a->out.c_str());
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
