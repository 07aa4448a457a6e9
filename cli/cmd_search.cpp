// lcplan search: the fastest plans that fit, the Pareto front, and the reduced recipe.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include <unistd.h>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "estimator/plan_rules.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "search/emit.h"
#include "search/megatron_args.h"
#include "search/reduce.h"
#include "search/search.h"

namespace lcplan::cli {

namespace {

struct SearchArgs {
  PlanFlags plan;
  std::string headroom = "4", objective = "throughput", floor, emit, out, top = "10";
  bool json = false, explain_rejects = false;
};

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

// Flags restrict dimensions; each pinned value is checked alone first so a contradictory pin gets its own sentence.
PlanSpace space_from_flags(const PlanFlags& f, const ModelSpec& m, const Plan& base) {
  PlanSpace s = default_space(m, base);
  struct Dim {
    const std::string& text;
    const char* flag;
    std::vector<int>& values;
    int Parallel::*member;
  };
  Dim dims[] = {{f.tp, "--tp", s.tp, &Parallel::tp},   {f.pp, "--pp", s.pp, &Parallel::pp},
                {f.vpp, "--vpp", s.vpp, &Parallel::vpp}, {f.cp, "--cp", s.cp, &Parallel::cp},
                {f.ep, "--ep", s.ep, &Parallel::ep},   {f.etp, "--etp", s.etp, &Parallel::etp}};
  for (auto& d : dims) {
    if (d.text.empty()) continue;
    d.values = parse_int_list(d.text, d.flag);
    for (int v : d.values) {
      Plan probe = base;
      probe.parallel = {};
      probe.parallel.*(d.member) = v;
      if (d.member == &Parallel::vpp && v > 1) probe.parallel.pp = 2;  // vpp alone needs some pp to be judged
      probe.moe = {};
      probe.recompute = Recompute::None;
      probe.recompute_layers = 0;
      probe.global_batch = 0;
      if (auto bad = check_plan(m, probe); bad && bad->rule != Rule::BatchDivisible && bad->rule != Rule::VppNeedsPp &&
                                           bad->rule != Rule::LayersSplit)
        throw UserError(std::string(d.flag) + " " + std::to_string(v) + " cannot work: " + bad->message);
    }
  }
  if (!f.micro_batch.empty()) s.micro_batch = parse_int_list(f.micro_batch, "--micro-batch");
  if (!f.ep_chunks.empty()) s.ep_chunks = parse_int_list(f.ep_chunks, "--ep-chunks");
  if (!f.recompute_layers.empty()) s.recompute_layers = parse_int_list(f.recompute_layers, "--recompute-layers", 0);
  const std::string sharding = optimizer_sharding_flag(f);
  if (!sharding.empty()) s.sharding = parse_list<OptimizerSharding>(sharding, parse_optimizer_sharding);
  if (!f.recompute.empty()) s.recompute = parse_list<Recompute>(f.recompute, parse_recompute);
  if (f.linear_ce_on) s.linear_ce = {true};
  if (f.linear_ce_off) s.linear_ce = {false};
  if (f.offload_optimizer) s.offload_optimizer = {true};
  return s;
}

// A search longer than a second shows its progress on stderr, but only when stderr is a terminal, and erases it when
// the search ends (or throws): redirected stderr never holds more than the one error sentence, and on a terminal
// the table or the error starts on a clean line.
class ProgressLine {
 public:
  void update(size_t done, size_t total) {
    if (!tty_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (s <= 1.0) return;
    std::fprintf(stderr, "\rsearching: %zu / %zu plans (%.0f%%), %.1f s", done, total, 100.0 * done / total, s);
    shown_ = true;
  }
  ~ProgressLine() {
    if (shown_) std::fputs("\r\033[K", stderr);
  }

 private:
  const bool tty_ = ::isatty(STDERR_FILENO) == 1;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  bool shown_ = false;
};

}  // namespace

void register_search(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SearchArgs>();
  auto* cmd = app.add_subcommand("search", "find the fastest plans that fit, the Pareto front and the reduced recipe");
  add_plan_flags(cmd, a->plan);
  cmd->add_option("--headroom", a->headroom, "GiB of HBM to keep free (default 4)");
  cmd->add_option("--objective", a->objective, "throughput (default) or memory (smallest peak above --throughput-floor)");
  cmd->add_option("--throughput-floor", a->floor, "memory objective: minimum tokens/s per GPU");
  cmd->add_option("--top", a->top, "rows in the table (default 10)");
  cmd->add_flag("--explain-rejects", a->explain_rejects, "count rejected plans per rule");
  cmd->add_flag("--json", a->json, "print the search record as JSON");
  cmd->add_option("--out", a->out, "write the best plan as recipe.json (accepted by estimate --plan and the executor)");
  cmd->add_option("--emit", a->emit, "megatron: print Megatron-LM flags for the best plan");
  cmd->callback([a, &exit_code]() {
    StartingPoint start = starting_point(a->plan, /*allow_lists=*/true);
    Plan& base = start.plan;
    if (start.from_megatron) {
      // The launch gives the fixed fields (model, GPUs, sequence, batch, precision, ...); the dimensions the search
      // walks stay free unless pinned with lcplan's flags, so the launch's pipeline split (for its pp) is dropped,
      // and a global batch the launch left at Megatron's default (micro batch x dp of its layout) too.
      base.pipeline = {};
      if (!start.global_batch_given) base.global_batch = 0;
    }
    const Inputs in = load_inputs(base, a->plan.calibration, start.model);
    if (a->plan.global_batch.empty() && base.global_batch == 0) base.global_batch = base.gpus;  // one sequence per GPU
    SearchOptions opt;
    const double hbm_gib = in.hardware.hbm_bytes / double(1 << 30);
    char headroom_range[128];
    std::snprintf(headroom_range, sizeof headroom_range, "GiB from 0 up to below the %.1f GiB of %s", hbm_gib,
                  in.hardware.name.c_str());
    const double headroom = parse_number(a->headroom, "--headroom", 0, HUGE_VAL, headroom_range);
    if (headroom >= hbm_gib)
      throw UserError("--headroom \"" + a->headroom + "\" is out of range (valid: " + headroom_range + ")");
    opt.headroom_bytes = headroom * (1 << 30);
    if (a->objective == "memory") opt.objective = Objective::Memory;
    else if (a->objective != "throughput")
      throw UserError("--objective \"" + a->objective + "\" is not valid (valid: throughput or memory)");
    if (!a->floor.empty()) {
      if (opt.objective != Objective::Memory)
        throw UserError("--throughput-floor applies only to --objective memory (add it or drop the floor)");
      opt.throughput_floor = parse_number(a->floor, "--throughput-floor", 0, HUGE_VAL, "0 or more tokens/s per GPU");
    }
    opt.top_k = parse_int_in(a->top, "--top", 1, 1000);
    if (!a->emit.empty() && a->emit != "megatron")
      throw UserError("--emit \"" + a->emit + "\" is not valid (valid: megatron)");
    const PlanSpace space = space_from_flags(a->plan, in.model, base);

    const SearchResult r = [&] {
      ProgressLine line;
      return search_plans(in.model, base, space, in.hardware, in.calibration, opt,
                          [&](size_t done, size_t total) { line.update(done, total); });
    }();
    const ReducedRecipe recipe = reduce_recipe(in.model, base, in.hardware, in.calibration, opt, r);

    if (r.top.empty()) {
      // Nothing fits: say why on stderr, print no table that could be mistaken for a result.
      throw UserError(explain_infeasible(r, in.hardware, opt));
    }
    const Candidate& best = r.top.front();
    if (!a->out.empty()) write_file_atomic(a->out, plan_to_json(best.plan).dump(2) + "\n");
    print_warnings(start);
    if (a->json) std::printf("%s\n", search_json(r, recipe).dump(2).c_str());
    else std::fputs(search_table(r, recipe, a->explain_rejects, 8).c_str(), stdout);
    if (a->emit == "megatron") {
      // Model-shape flags first (when Megatron-LM's flags can describe the model), then the plan's.
      const std::string shape = megatron_model_flags(in.model);
      std::printf("\n%s%s", shape.empty() ? "" : (shape + " \\\n").c_str(), megatron_flags(best.plan, in.model).c_str());
      if (shape.empty())
        std::printf("# model %s: its layers (gated DeltaNet, sliding window, ...) have no Megatron-LM shape flags here; "
                    "use its Megatron-Bridge provider\n", in.model.name.c_str());
    }
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
