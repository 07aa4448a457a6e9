#include "cli/search_flags.h"

#include <cmath>
#include <cstdio>

#include "common/progress.h"
#include "common/user_error.h"
#include "search/space_constraints.h"

namespace lcplan::cli {

namespace {

template <typename T>
std::vector<T> parse_list(const std::string& text, T (*one)(const std::string&)) {
  std::vector<T> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(one(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Flags restrict dimensions (search/space_constraints.h checks each pinned value alone).
PlanSpace space_from_flags(const PlanFlags& f, const ModelSpec& m, const Plan& base) {
  SpaceConstraints c;
  const std::pair<const std::string&, std::optional<std::vector<int>>&> sizes[] = {
      {f.tp, c.tp}, {f.pp, c.pp}, {f.vpp, c.vpp}, {f.cp, c.cp}, {f.ep, c.ep}, {f.etp, c.etp}};
  const char* names[] = {"--tp", "--pp", "--vpp", "--cp", "--ep", "--etp"};
  for (size_t i = 0; i < std::size(sizes); ++i)
    if (!sizes[i].first.empty()) sizes[i].second = parse_int_list(sizes[i].first, names[i]);
  if (!f.micro_batch.empty()) c.micro_batch = parse_int_list(f.micro_batch, "--micro-batch");
  if (!f.ep_chunks.empty()) c.ep_chunks = parse_int_list(f.ep_chunks, "--ep-chunks");
  if (!f.recompute_layers.empty()) c.recompute_layers = parse_int_list(f.recompute_layers, "--recompute-layers", 0);
  const std::string sharding = optimizer_sharding_flag(f);
  if (!sharding.empty()) c.sharding = parse_list<OptimizerSharding>(sharding, parse_optimizer_sharding);
  if (!f.recompute.empty()) c.recompute = parse_list<Recompute>(f.recompute, parse_recompute);
  if (f.linear_ce_on) c.linear_ce = std::vector<bool>{true};
  if (f.linear_ce_off) c.linear_ce = std::vector<bool>{false};
  if (f.offload_optimizer) c.offload_optimizer = std::vector<bool>{true};
  return constrained_space(m, base, c, "--");
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
  Inputs in = load_inputs(base, flags.calibration, start.model);
  if (flags.global_batch.empty() && base.global_batch == 0) base.global_batch = base.gpus;  // one sequence per GPU
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
  PlanSpace space = space_from_flags(flags, in.model, base);
  return {std::move(start), std::move(base), std::move(in), std::move(opt), std::move(space)};
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
  return {std::move(base), std::move(in), opt, std::move(r), std::move(recipe)};
}

}  // namespace lcplan::cli
