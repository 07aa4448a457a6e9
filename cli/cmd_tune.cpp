// lcplan tune: search, run the best plans (lcplan-exec or any command), refit the calibration to what was measured,
// re-rank; repeat until the ranking and the chosen plan are stable or the budget of runs is spent (tune/tune_loop.h).
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>

#include "calibrate/calibrate_fit.h"
#include "calibrate/measurement.h"
#include "cli/commands.h"
#include "cli/search_flags.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "search/emit.h"
#include "search/megatron_args.h"
#include "tune/launcher.h"
#include "tune/refit.h"
#include "tune/tune_log.h"
#include "tune/tune_hooks.h"
#include "tune/tune_loop.h"
#ifdef LCPLAN_WITH_EXECUTOR
#include "executor/scale.h"
#endif

namespace lcplan::cli {

namespace {

namespace fs = std::filesystem;

// Step-time coefficients a handful of runs of one model on one machine can move; the fit keeps at its prior any
// the runs do not identify (calibrate/calibrate_fit.h). By default those the starting calibration can fit.
const char* kDefaultFit =
    "time.gemm_efficiency,time.attention_efficiency,time.grouped_gemm_efficiency,time.a2a_nvlink_efficiency,"
    "time.step_overhead_seconds";

struct TuneArgs {
  PlanFlags plan;
  SearchFlags search;
  std::string launcher = "exec", per_round = "3", max_runs = "9", max_rounds = "4", fit;
  std::string prior_width = "1", run_dir = "tune-runs", log, out, calibration_out, run_timeout = "3600";
  std::string exec_args = "--steps 3", mpirun = "mpirun", exec, skip_iterations = "1";
  bool fresh = false;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string k = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!k.empty()) out.push_back(k);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// lcplan-exec next to this lcplan (the build tree and an installed bin/ keep them together).
std::string default_exec_path() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "lcplan-exec";
  buf[n] = 0;
  return (fs::path(buf).parent_path() / "lcplan-exec").string();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.3f s" : "%.1f s", s);
  return buf;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * x);
  return std::isfinite(x) ? buf : "-";
}

// The loop's options and the run settings, parsed; bad values are one sentence each, before any run.
struct TuneSettings {
  TuneOptions loop;
  double prior_width = 1, run_timeout = 3600;
  int skip_iterations = 1;
  bool exec = false;
  std::vector<std::string> fit_keys;
  std::string log_path;
};

TuneSettings parse_settings(TuneArgs& a) {
  TuneSettings t;
  t.loop.plans_per_round = parse_int_in(a.per_round, "--plans-per-round", 1, 100);
  t.loop.max_runs = parse_int_in(a.max_runs, "--max-runs", 1, 10000);
  t.loop.max_rounds = parse_int_in(a.max_rounds, "--max-rounds", 1, 1000);
  t.prior_width = parse_number(a.prior_width, "--prior-width", 0.01, 10, "0.01 to 10");
  t.run_timeout = parse_number(a.run_timeout, "--run-timeout", 1, 1e7, "1 second or more");
  t.skip_iterations = parse_int_in(a.skip_iterations, "--skip-iterations", 0, 1000000);
  t.exec = a.launcher == "exec";
  if (!t.exec) check_launch_template(a.launcher);
  if (t.exec) {
#ifndef LCPLAN_WITH_EXECUTOR
    throw UserError("--launcher exec needs lcplan-exec, which this build leaves out (build with MPI), or give a command template");
#endif
    if (!a.plan.implementation.empty() && a.plan.implementation != "lcplan-exec")
      throw UserError("--implementation " + a.plan.implementation +
                      " contradicts --launcher exec, which runs lcplan-exec (drop it, or give a command template)");
    a.plan.implementation = "lcplan-exec";
  }
  t.fit_keys = split_commas(a.fit.empty() ? kDefaultFit : a.fit);
  if (t.fit_keys.empty()) throw UserError("--fit names no coefficient (give comma-separated keys such as time.gemm_efficiency)");
  for (const std::string& k : t.fit_keys) {
    const CoefficientInfo* info = find_coefficient(k);
    if (!info || !info->fittable)
      throw UserError("--fit " + k + " is not a fittable coefficient (see the keys of data/calibration/default.json)");
  }
  // Paths are checked before any run, so a bad one cannot waste a run.
  // The run folder is made by the first run, so a tune refused here leaves no empty folder behind.
  fs::path existing = fs::absolute(a.run_dir);
  while (!fs::exists(existing) && existing.has_parent_path() && existing != existing.parent_path()) existing = existing.parent_path();
  if (!fs::is_directory(existing) || ::access(existing.c_str(), W_OK) != 0)
    throw UserError("--run-dir " + a.run_dir + " cannot be created (" + existing.string() +
                    " is not a writable folder; give another --run-dir)");
  t.log_path = a.log.empty() ? (fs::path(a.run_dir) / "tune-log.json").string() : a.log;
  for (const std::string* f : {&a.out, &a.calibration_out, &a.log})
    if (!f->empty() && !fs::is_directory(fs::path(*f).parent_path().empty() ? fs::path(".") : fs::path(*f).parent_path()))
      throw UserError(*f + ": its directory does not exist (create it or give another path)");
  return t;
}

// The fit moves coefficients by factors, so one the starting calibration holds at 0 cannot be fitted: the default
// set leaves such keys out (a CPU profile has no fixed per-step cost), a --fit naming one is refused before any run.
void choose_fit_keys(const TuneArgs& a, TuneSettings& t, const Calibration& start) {
  std::vector<std::string> usable;
  for (const std::string& k : t.fit_keys) {
    if (start.*(find_coefficient(k)->member) > 0) {
      usable.push_back(k);
      continue;
    }
    if (!a.fit.empty())
      throw UserError("--fit " + k + " cannot be refitted: the starting calibration " + start.name +
                      " holds it at 0 and a fit moves coefficients by factors (drop it from --fit)");
  }
  if (usable.empty()) throw UserError("--fit leaves nothing to refit: the starting calibration " + start.name +
                                      " holds every candidate at 0 (give --fit keys it holds positive)");
  t.fit_keys = usable;
}

// What the tune was asked: a log written for another request is not resumed (tune/tune_log.h). The refit settings
// (--fit, --prior-width) are not part of it: the runs stand whatever is refitted from them.
nlohmann::json tune_request(const TuneArgs& a, const TuneSettings& t, const SearchSetup& setup, const std::string& tmpl,
                            const Calibration& start) {
  return {{"base_plan", plan_to_json(setup.base)},
          {"space", setup.space_request},
          {"headroom_bytes", setup.options.headroom_bytes},
          {"objective", a.search.objective},
          {"launcher", tmpl},
          {"plans_per_round", t.loop.plans_per_round},
          {"start_calibration", calibration_to_json(start)}};
}

void print_round(const TuneState& s) {
  const TuneRound& r = s.rounds.back();
  std::printf("round %d: %zu runs; mean step-time error %s -> %s after the refit\n", r.round, r.ran.size(),
              percent(r.error_before).substr(1).c_str(), percent(r.error_after).substr(1).c_str());
  for (const FittedCoefficient& c : r.coefficients)
    std::printf("  %-34s %10.4g -> %-10.4g%s\n", c.key.c_str(), c.prior, c.value, c.identified ? "" : "  (prior kept)");
  std::printf("  ranking:\n");
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const RankedPlan& p = r.ranking[i];
    std::string measured = "not run";
    for (const TuneRun& run : s.runs)
      if (run.ranked.key == p.key && run.measured.step_seconds)
        measured = "run " + std::to_string(run.index) + " measured " + seconds_text(*run.measured.step_seconds);
    std::printf("  %zu. %-56s predicted %-10s %s\n", i + 1, plan_label(p.plan).c_str(),
                seconds_text(p.predicted_seconds).c_str(), measured.c_str());
  }
  std::fflush(stdout);
}

void print_runs(const TuneState& state, const TuneHooks& hooks) {
  std::printf("%-4s %-56s %12s %12s %8s\n", "run", "plan", "measured", "predicted", "error");
  for (const TuneRun& r : state.runs) {
    if (!r.measured.step_seconds) {
      std::printf("%-4d %-56s %12s\n", r.index, plan_label(r.ranked.plan).c_str(), "did not fit");
      continue;
    }
    const double pred = hooks.predict(r.measured, state.calibration);
    std::printf("%-4d %-56s %12s %12s %8s\n", r.index, plan_label(r.ranked.plan).c_str(),
                seconds_text(*r.measured.step_seconds).c_str(), seconds_text(pred).c_str(),
                percent(pred / *r.measured.step_seconds - 1).c_str());
  }
}

// The chosen plan and the refit calibration, when asked for; 1 when no run measured a step time.
int write_outcome(const TuneArgs& a, const TuneState& state, const TuneOutcome& outcome, const Inputs& in,
                  const Plan& base, const std::string& log_path) {
  if (outcome.chosen_run == 0) {
    std::fprintf(stderr, "lcplan: no run of this tune completed with a step time (see %s)\n", log_path.c_str());
    return 1;
  }
  const TuneRun& chosen = state.runs[size_t(outcome.chosen_run - 1)];
  std::printf("chosen: run %d, %s, measured %s (the fastest measured)\n", chosen.index,
              plan_label(chosen.ranked.plan).c_str(), seconds_text(*chosen.measured.step_seconds).c_str());
  if (!a.out.empty()) write_plan_file(a.out, chosen.ranked.plan);
  if (!a.calibration_out.empty()) {
    nlohmann::json j = calibration_to_json(state.calibration);
    j["name"] = "tuned";
    j["description"] = "lcplan tune: " + (a.plan.calibration.empty() ? std::string("default") : a.plan.calibration) +
                       " for " + in.hardware.name + " and " + base.implementation + ", refit to " +
                       std::to_string(state.runs.size()) + " runs (" + log_path + ")";
    write_file_atomic(a.calibration_out, j.dump(2) + "\n");
  }
  std::printf("log: %s\n", log_path.c_str());
  return 0;
}

int run_tune_command(TuneArgs& a) {
  TuneSettings t = parse_settings(a);
  SearchSetup setup = prepare_search(a.plan, a.search);
  const Inputs& in = setup.in;
  print_warnings(setup.start);
  TuneSetup ts;
  // The calibration this machine and framework read, flattened: the refit moves exactly the values they use.
  ts.start = in.calibration;
  ts.start.per_hardware.clear();
  ts.start.per_implementation.clear();
  ts.start.fit = nullptr;
  choose_fit_keys(a, t, ts.start);
  const std::string exec_path = a.exec.empty() ? default_exec_path() : a.exec;
  ts.launch_template = t.exec ? a.mpirun + " -np {gpus} " + shell_quote(exec_path) + " --plan {plan} --out {out} " + a.exec_args
                              : a.launcher;
  const nlohmann::json request = tune_request(a, t, setup, ts.launch_template, ts.start);
  TuneState state;
  state.calibration = ts.start;
  const nlohmann::json refit = {{"fit", t.fit_keys}, {"prior_width", t.prior_width}};
  if (!a.fresh && fs::exists(t.log_path)) {
    const nlohmann::json log = read_json_file(t.log_path, "tune log");
    state = tune_state_from_log(log, request, t.log_path);
    std::printf("resuming %s: %zu runs, %zu rounds done\n", t.log_path.c_str(), state.runs.size(), state.rounds.size());
    if (log.value("refit", nlohmann::json()) != refit) {
      // Other refit settings: the runs stay, their rounds are refitted again from the start.
      std::printf("the refit settings changed (--fit, --prior-width): the %zu runs are kept and refitted\n", state.runs.size());
      state.rounds.clear();
      state.calibration = ts.start;
    }
  }
  ts.model = in.model;
  ts.hardware = in.hardware;
  ts.base = setup.base;
  ts.space = setup.space;
  ts.search = setup.options;
#ifdef LCPLAN_WITH_EXECUTOR
  // Plans the launcher can run: lcplan-exec's own limits (executor/scale.h); a command template runs anything.
  if (t.exec) ts.runnable = [&in](const Plan& p) { return exec::executor_support_error(in.model, p).empty(); };
#endif
  ts.run_dir = a.run_dir;
  ts.run_timeout = t.run_timeout;
  ts.skip_iterations = t.skip_iterations;
  ts.refit.keys = t.fit_keys;
  ts.refit.prior_width = t.prior_width;
  ts.refit.source = t.log_path;
  ts.data_dir = data_dir();
  ts.say = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  TuneHooks hooks = make_tune_hooks(ts);
  auto write_log = [&](const TuneState& s, const std::optional<TuneOutcome>& o) {
    nlohmann::json j = tune_log_json(request, s, o);
    j["refit"] = refit;
    write_file_atomic(t.log_path, j.dump(2) + "\n");
  };
  hooks.on_run = [&](const TuneState& s) { write_log(s, std::nullopt); };
  hooks.on_round = [&](const TuneState& s) {
    write_log(s, std::nullopt);
    print_round(s);
  };
  std::printf("tune: %s on %d x %s, launcher %s, %d plans per round, at most %d runs and %d rounds\n",
              in.model.name.c_str(), setup.base.gpus, in.hardware.name.c_str(), t.exec ? "exec" : "template",
              t.loop.plans_per_round, t.loop.max_runs, t.loop.max_rounds);
  std::fflush(stdout);
  const TuneOutcome outcome = run_tune(state, hooks, t.loop);
  write_log(state, outcome);
  std::printf("\nstopped: %s\n", to_string(outcome.stop));
  print_runs(state, hooks);
  return write_outcome(a, state, outcome, in, setup.base, t.log_path);
}

}  // namespace

void register_tune(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand(
      "tune", "search, run the best plans, refit the calibration to the runs, re-rank; until stable or out of runs");
  add_plan_flags(cmd, a->plan);
  add_search_flags(cmd, a->search);
  cmd->add_option("--launcher", a->launcher,
                  "exec (lcplan-exec under --mpirun) or a command template run by /bin/sh, e.g. 'srun -N 4 python "
                  "pretrain_gpt.py {megatron_model_flags} {megatron_flags} ...' (placeholders: README \"Tune\")");
  cmd->add_option("--plans-per-round", a->per_round, "the best plans run each round, those not run yet (default 3)");
  cmd->add_option("--max-runs", a->max_runs, "runs over the whole tune, resumed ones included (default 9)");
  cmd->add_option("--max-rounds", a->max_rounds, "rounds (default 4)");
  cmd->add_option("--fit", a->fit, std::string("coefficients refitted to the runs (default: those of ") + kDefaultFit +
                                       " the starting calibration holds positive)");
  cmd->add_option("--prior-width", a->prior_width,
                  "how far (natural log) the refit may move a coefficient from the starting calibration before the runs "
                  "must insist (default 1, a factor of e)");
  cmd->add_option("--run-dir", a->run_dir, "one folder per run: plan.json, the log, the measurement (default tune-runs)");
  cmd->add_option("--log", a->log, "the tune log, written after every run; resumed when it exists (default RUN_DIR/tune-log.json)");
  cmd->add_flag("--fresh", a->fresh, "start afresh even when the log exists (it is overwritten)");
  cmd->add_option("--out", a->out, "write the chosen plan (the measured-fastest run) as recipe.json");
  cmd->add_option("--calibration-out", a->calibration_out, "write the refit calibration profile here");
  cmd->add_option("--run-timeout", a->run_timeout, "seconds one run may take before it is stopped (default 3600)");
  cmd->add_option("--exec-args", a->exec_args, "exec launcher: extra lcplan-exec flags (default --steps 3)");
  cmd->add_option("--mpirun", a->mpirun, "exec launcher: the MPI launcher command (default mpirun)");
  cmd->add_option("--exec", a->exec, "exec launcher: the lcplan-exec binary (default: next to lcplan)");
  cmd->add_option("--skip-iterations", a->skip_iterations,
                  "template launcher: logged Megatron-LM iterations dropped as warm-up (default 1)");
  cmd->callback([a, &exit_code]() { exit_code = run_tune_command(*a); });
}

}  // namespace lcplan::cli
