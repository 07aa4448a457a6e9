#include "cli/search_flags.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "common/progress.h"
#include "common/user_error.h"
#include "estimator/frameworks.h"

namespace lcplan::cli {

namespace {

// The dimension flags given, as search/space_constraints.h's request: whole numbers parsed here (one sentence per
// bad entry of a comma list), names as written; --linear-ce / --no-linear-ce and --offload-optimizer as switches.
nlohmann::json space_request(const PlanFlags& f) {
  static const std::map<std::string, std::string PlanFlags::*> text = {
      {"tp", &PlanFlags::tp},
      {"pp", &PlanFlags::pp},
      {"vpp", &PlanFlags::vpp},
      {"cp", &PlanFlags::cp},
      {"ep", &PlanFlags::ep},
      {"etp", &PlanFlags::etp},
      {"micro_batch", &PlanFlags::micro_batch},
      {"ep_chunks", &PlanFlags::ep_chunks},
      {"recompute_layers", &PlanFlags::recompute_layers},
      {"recompute", &PlanFlags::recompute}};
  nlohmann::json r = nlohmann::json::object();
  for (const SpaceDimension& d : space_dimensions()) {
    if (d.kind == DimensionKind::Switch) continue;
    const std::string given = d.kind == DimensionKind::Sharding ? optimizer_sharding_flag(f) : f.*text.at(d.key);
    if (given.empty()) continue;
    r[d.key] = d.kind == DimensionKind::Count ? nlohmann::json(parse_int_list(given, d.flag, d.least)) : nlohmann::json(given);
  }
  if (f.linear_ce_on || f.linear_ce_off) r["linear_ce"] = f.linear_ce_on;
  if (f.offload_optimizer) r["offload_optimizer"] = true;
  return r;
}

}  // namespace

void add_search_flags(CLI::App* cmd, SearchFlags& f) {
  cmd->add_option("--headroom", f.headroom, "GiB of HBM to keep free (default 4)");
  cmd->add_option("--objective", f.objective, "throughput (default) or memory (smallest peak above --throughput-floor)");
  cmd->add_option("--throughput-floor", f.floor, "memory objective: minimum tokens/s per GPU");
  cmd->add_option("--top", f.top, "rows in the table (default 10)");
}

std::vector<std::string> given_search_flags(const SearchFlags& f) {
  const SearchFlags d;
  std::vector<std::string> given;
  if (f.headroom != d.headroom) given.push_back("--headroom");
  if (f.objective != d.objective) given.push_back("--objective");
  if (f.floor != d.floor) given.push_back("--throughput-floor");
  if (f.top != d.top) given.push_back("--top");
  return given;
}

SearchSetup prepare_search(const PlanFlags& flags, const SearchFlags& a) {
  StartingPoint start = starting_point(flags, /*allow_lists=*/true);
  Plan base = start.plan;
  if (start.from_megatron) {
    // The launch gives the fixed fields (model, GPUs, sequence, batch, precision, ...); the dimensions the search
    // walks stay free unless pinned with lcplan's flags, so the launch's pipeline split (for its pp) is dropped,
    // and a global batch the launch left at Megatron's default (micro batch x dp of its layout) too.
    base.pipeline = {};
    if (!start.global_batch_given) base.global_batch = 0;
  }
  Inputs in = load_inputs(base, flags.calibration, start.model, /*search=*/true);
  // The default every output states (estimator/plan.h effective_global_batch), fixed before the walk so that every
  // candidate trains on the same tokens.
  const bool defaulted = flags.global_batch.empty() && base.global_batch == 0;
  if (defaulted) base.global_batch = effective_global_batch(base);
  SearchOptions opt;
  const double hbm_gib = in.hardware.hbm_bytes / double(1 << 30);
  char headroom_range[128];
  std::snprintf(headroom_range, sizeof headroom_range, "GiB from 0 up to below the %.1f GiB of %s", hbm_gib,
                in.hardware.name.c_str());
  const double headroom = parse_number(a.headroom, "--headroom", 0, HUGE_VAL, headroom_range);
  if (headroom >= hbm_gib)
    throw UserError("--headroom \"" + a.headroom + "\" is out of range (valid: " + headroom_range + ")");
  opt.headroom_bytes = headroom * (1 << 30);
  if (a.objective == "memory") opt.objective = Objective::Memory;
  else if (a.objective != "throughput")
    throw UserError("--objective \"" + a.objective + "\" is not valid (valid: throughput or memory)");
  if (!a.floor.empty()) {
    if (opt.objective != Objective::Memory)
      throw UserError("--throughput-floor applies only to --objective memory (add it or drop the floor)");
    opt.throughput_floor = parse_number(a.floor, "--throughput-floor", 0, HUGE_VAL, "0 or more tokens/s per GPU");
  }
  opt.top_k = parse_int_in(a.top, "--top", 1, 1000);
  // The framework's own limits between a layout and its settings (lcplan-exec's kernels, Megatron-LM's checks).
  if (const Framework* fw = find_framework(base.implementation); fw && fw->can.limits) {
    opt.admit = [fw, model = in.model](const Plan& p) { return fw->can.limits(model, p).empty(); };
  }
  nlohmann::json request = space_request(flags);
  PlanSpace space = search_space(in.model, base, parse_space_request(request, Naming::Flags), Naming::Flags);
  SearchSetup out{std::move(start), std::move(base), defaulted, std::move(in), std::move(opt), std::move(request),
                  std::move(space)};
  return out;
}

SearchRun run_search(const PlanFlags& flags, const SearchFlags& a) {
  SearchSetup s = prepare_search(flags, a);
  Plan& base = s.base;
  Inputs& in = s.in;
  const SearchOptions& opt = s.options;
  const PlanSpace& space = s.space;
  const StartingPoint& start = s.start;

  // The progress line lives only as long as the search: it is erased before the result or an error is printed.
  SearchResult r = [&] {
    TerminalProgress line(stderr, "searching", "plans");
    return search_plans(in.model, base, space, in.hardware, in.calibration, opt, [&](const SearchProgress& s) {
      line.update({s.done, s.total, 0, s.has_best, s.best_tokens_per_second_per_gpu, s.best_tflops_per_gpu});
    });
  }();
  ReducedRecipe recipe = reduce_recipe(in.model, base, in.hardware, in.calibration, opt, r);
  // Nothing fits: say why on stderr, print no table that could be mistaken for a result.
  if (r.top.empty()) throw UserError(explain_infeasible(r, in.hardware, opt));
  print_warnings(start);
  return {std::move(base), s.global_batch_defaulted, std::move(in), opt, std::move(r), std::move(recipe)};
}

BatchSearchRun run_batch_search(const PlanFlags& plan, const SearchFlags& flags, const BatchFlags& batches,
                                const LengthDistribution& dist) {
  BatchSearchRun run;
  SearchSetup& s = run.setup;
  s = prepare_search(plan, flags);
  if (s.global_batch_defaulted && !batches.global_tokens.empty()) s.base.global_batch = 0;  // tokens size the step
  prepare_batches(batches, dist, s.in.model, s.base);
  run.packing = s.base.batches->packing;
  Plan base = s.base;
  base.batches = nullptr;  // each candidate gets its own (its budget)
  run.result = search_batches(s.in.model, base, s.space, s.in.hardware, s.in.calibration, s.options, dist, run.packing);
  run.recipe = reduce_batch_recipe(s.in.model, base, s.in.hardware, s.in.calibration, s.options, dist, run.packing, run.result);
  return run;
}

}  // namespace lcplan::cli
