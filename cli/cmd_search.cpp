// lcplan search: the fastest plans that fit, the Pareto front, and the reduced recipe.
#include <climits>
#include <cstdio>
#include <memory>

#include "cli/batch_flags.h"
#include "cli/commands.h"
#include "cli/search_flags.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "search/batch_search.h"
#include "search/emit.h"
#include "search/megatron_args.h"

namespace lcplan::cli {

namespace {

struct SearchArgs {
  PlanFlags plan;
  SearchFlags search;
  std::string emit, out, out_plan = "1";
  bool json = false, explain_rejects = false;
  BatchFlags batches;
};

// Megatron-LM flags for a plan: the model's shape flags first (when Megatron-LM's flags can describe the model).
void print_megatron_flags(const Plan& p, const ModelSpec& m) {
  const std::string shape = megatron_model_flags(m, /*with_mtp=*/false);
  std::printf("\n%s%s", shape.empty() ? "" : (shape + " \\\n").c_str(), megatron_flags(p, m).c_str());
  if (shape.empty())
    std::printf("# model %s: its layers (gated DeltaNet, sliding window, ...) have no Megatron-LM shape flags here; "
                "use its Megatron-Bridge provider\n", m.name.c_str());
}

// The batch plan --out writes: the N-th best (1-based) or the reduced recipe; one sentence when there is no such plan.
const BatchCandidate& chosen_batch_plan(const std::string& which, const BatchSearchResult& r, const BatchRecipe& recipe) {
  if (which == "reduced") {
    if (!recipe.found) throw UserError("--out-plan reduced: the reduced recipe found no plan whose fullest microbatch fits (see the search's output)");
    return recipe.plan;
  }
  const int n = parse_int_in(which, "--out-plan", 1, INT_MAX);
  if (r.top.empty()) throw UserError("--out-plan " + which + ": no plan fits its fullest microbatch (see the search's table)");
  if (size_t(n) > r.top.size())
    throw UserError("--out-plan " + which + " is beyond the " + std::to_string(r.top.size()) +
                    " best plans (valid: 1 to " + std::to_string(r.top.size()) + ", or reduced; --top lists more)");
  return r.top[size_t(n - 1)];
}

// search --seq-lengths: the layouts and token budgets that maximize expected tokens/s over the drawn batches.
void search_over_batches(SearchArgs& a, const LengthDistribution& dist) {
  if (a.explain_rejects)
    throw UserError("--explain-rejects does not apply to a search over --seq-lengths yet (valid: the table, --json, --out, "
                    "--out-plan, --emit megatron)");
  const BatchSearchRun run = run_batch_search(a.plan, a.search, a.batches, dist);
  const SearchSetup& s = run.setup;
  const BatchSearchResult& r = run.result;
  print_warnings(s.start);
  // Chosen before anything is printed or written, so a bad --out-plan leaves no partial output.
  const BatchCandidate* chosen = a.out.empty() && a.emit.empty() ? nullptr : &chosen_batch_plan(a.out_plan, r, run.recipe);
  if (!a.out.empty()) write_plan_file(a.out, chosen->plan);  // with its batches and budget
  if (a.json) {
    std::printf("%s\n", batch_search_json(r, &run.recipe).dump(2).c_str());
  } else {
    std::fputs((run_header(s.base, s.in.model.name, s.in.hardware.name, s.global_batch_defaulted, false) +
                batch_search_table(r, 8) + batch_recipe_text(run.recipe) + band_note(s.in, s.base.implementation))
                   .c_str(),
               stdout);
    if (!r.top.empty()) {
      PackingOptions best = run.packing;
      best.tokens_per_microbatch = r.top.front().tokens_per_microbatch;
      std::fputs(("\nthe best plan over the drawn batches:\n" + batch_estimate_table(r.top.front().batches, dist, best)).c_str(),
                 stdout);
    }
  }
  if (chosen && a.emit == "megatron") print_megatron_flags(chosen->plan, s.in.model);
}

// The plan --out writes: the N-th best (1-based) or the reduced recipe; one sentence when there is no such plan.
const Candidate& chosen_for_out(const std::string& which, const SearchResult& r, const ReducedRecipe& recipe) {
  if (which == "reduced") {
    if (!recipe.found) throw UserError("--out-plan reduced: the reduced recipe found no valid plan that fits (see the search's table)");
    return recipe.plan;
  }
  const int n = parse_int_in(which, "--out-plan", 1, INT_MAX);
  if (size_t(n) > r.top.size())
    throw UserError("--out-plan " + which + " is beyond the " + std::to_string(r.top.size()) +
                    " best plans (valid: 1 to " + std::to_string(r.top.size()) + ", or reduced; --top lists more)");
  return r.top[size_t(n - 1)];
}

}  // namespace

void register_search(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SearchArgs>();
  auto* cmd = app.add_subcommand("search", "find the fastest plans that fit, the Pareto front and the reduced recipe");
  add_plan_flags(cmd, a->plan);
  add_search_flags(cmd, a->search);
  cmd->add_flag("--explain-rejects", a->explain_rejects, "count rejected plans per rule");
  cmd->add_flag("--json", a->json, "print the search record as JSON");
  cmd->add_option("--out", a->out, "write the best plan as recipe.json (accepted by estimate --plan and the executor)");
  cmd->add_option("--out-plan", a->out_plan,
                  "which plan --out writes: N (the N-th best, default 1) or reduced (the reduced recipe)");
  cmd->add_option("--emit", a->emit, "megatron: print Megatron-LM flags for the best plan");
  add_batch_flags(cmd, a->batches);
  cmd->callback([a, &exit_code]() {
    if (!a->emit.empty() && a->emit != "megatron")
      throw UserError("--emit \"" + a->emit + "\" is not valid (valid: megatron)");
    if (const std::optional<LengthDistribution> dist = read_batch_lengths(a->batches, a->plan)) {
      search_over_batches(*a, *dist);
      exit_code = 0;
      return;
    }
    if (!a->out.empty()) require_loadable_model(a->plan, "--out " + a->out);
    const SearchRun run = run_search(a->plan, a->search);
    const SearchResult& r = run.result;
    const ReducedRecipe& recipe = run.recipe;
    const Inputs& in = run.in;
    const Candidate& best = r.top.front();
    if (!a->out.empty()) write_plan_file(a->out, chosen_for_out(a->out_plan, r, recipe).plan);
    if (a->json) std::printf("%s\n", search_json(r, recipe).dump(2).c_str());
    else
      std::fputs((run_header(run.base, in.model.name, in.hardware.name, run.global_batch_defaulted, false) +
                  search_table(r, recipe, a->explain_rejects, 8, run.options.objective) +
                  band_note(in, run.base.implementation))
                     .c_str(),
                 stdout);
    if (a->emit == "megatron") print_megatron_flags(best.plan, in.model);
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
