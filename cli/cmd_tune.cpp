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
#include "tune/tune_loop.h"
#ifdef LCPLAN_WITH_EXECUTOR
#include "executor/scale.h"
#endif

namespace lcplan::cli {

namespace {

namespace fs = std::filesystem;

// Step-time coefficients a handful of runs of one model on one machine can move; the fit keeps at its prior any
// the runs do not identify (calibrate/calibrate_fit.h).
const char* kDefaultFit =
    "time.gemm_efficiency,time.attention_efficiency,time.grouped_gemm_efficiency,time.a2a_nvlink_efficiency,"
    "time.step_overhead_seconds";

struct TuneArgs {
  PlanFlags plan;
  SearchFlags search;
  std::string launcher = "exec", per_round = "3", max_runs = "9", max_rounds = "4", fit = kDefaultFit;
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

// The flags of a plan as Megatron-LM reads them: the lines before emit's comment lines, joined.
std::string flags_line(const std::string& emitted) {
  std::string out;
  size_t start = 0;
  while (start < emitted.size()) {
    size_t end = emitted.find('\n', start);
    if (end == std::string::npos) end = emitted.size();
    const std::string line = emitted.substr(start, end - start);
    if (!line.empty() && line[0] == '#') break;
    out += (out.empty() ? "" : " ") + line;
    start = end + 1;
  }
  return out;
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
  cmd->add_option("--fit", a->fit, std::string("coefficients refitted to the runs (default ") + kDefaultFit + ")");
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
  cmd->callback([a, &exit_code]() {
    const std::string dir = data_dir();
    TuneOptions topt;
    topt.plans_per_round = parse_int_in(a->per_round, "--plans-per-round", 1, 100);
    topt.max_runs = parse_int_in(a->max_runs, "--max-runs", 1, 10000);
    topt.max_rounds = parse_int_in(a->max_rounds, "--max-rounds", 1, 1000);
    const double prior_width = parse_number(a->prior_width, "--prior-width", 0.01, 10, "0.01 to 10");
    const double run_timeout = parse_number(a->run_timeout, "--run-timeout", 1, 1e7, "1 second or more");
    const int skip_iterations = parse_int_in(a->skip_iterations, "--skip-iterations", 0, 1000000);
    const bool exec = a->launcher == "exec";
    if (!exec) check_launch_template(a->launcher);
    if (exec) {
#ifndef LCPLAN_WITH_EXECUTOR
      throw UserError("--launcher exec needs lcplan-exec, which this build leaves out (build with MPI), or give a command template");
#endif
      if (!a->plan.implementation.empty() && a->plan.implementation != "lcplan-exec")
        throw UserError("--implementation " + a->plan.implementation +
                        " contradicts --launcher exec, which runs lcplan-exec (drop it, or give a command template)");
      a->plan.implementation = "lcplan-exec";
    }
    const std::vector<std::string> fit_keys = split_commas(a->fit);
    if (fit_keys.empty()) throw UserError("--fit names no coefficient (give comma-separated keys such as time.gemm_efficiency)");
    for (const std::string& k : fit_keys) {
      const CoefficientInfo* info = find_coefficient(k);
      if (!info || !info->fittable)
        throw UserError("--fit " + k + " is not a fittable coefficient (see the keys of data/calibration/default.json)");
    }
    // Paths are checked before any run, so a bad one cannot waste a run.
    std::error_code ec;
    fs::create_directories(a->run_dir, ec);
    if (ec || !fs::is_directory(a->run_dir)) throw UserError("--run-dir " + a->run_dir + " cannot be created: " + ec.message());
    const std::string log_path = a->log.empty() ? (fs::path(a->run_dir) / "tune-log.json").string() : a->log;
    for (const std::string* f : {static_cast<const std::string*>(&a->out), static_cast<const std::string*>(&a->calibration_out), &log_path})
      if (!f->empty() && !fs::is_directory(fs::path(*f).parent_path().empty() ? fs::path(".") : fs::path(*f).parent_path()))
        throw UserError(*f + ": its directory does not exist (create it or give another path)");

    SearchSetup setup = prepare_search(a->plan, a->search);
    const Plan& base = setup.base;
    const Inputs& in = setup.in;
    print_warnings(setup.start);
    // The calibration this machine and framework read, flattened: the refit moves exactly the values they use.
    Calibration start = in.calibration;
    start.per_hardware.clear();
    start.per_implementation.clear();
    start.fit = nullptr;
    const std::string exec_path = a->exec.empty() ? default_exec_path() : a->exec;
    const std::string tmpl = exec ? a->mpirun + " -np {gpus} " + shell_quote(exec_path) + " --plan {plan} --out {out} " + a->exec_args
                                  : a->launcher;

    nlohmann::json request = {{"base_plan", plan_to_json(base)},
                              {"space", setup.space_request},
                              {"headroom_bytes", setup.options.headroom_bytes},
                              {"objective", a->search.objective},
                              {"launcher", tmpl},
                              {"plans_per_round", topt.plans_per_round},
                              {"fit", fit_keys},
                              {"prior_width", prior_width},
                              {"start_calibration", calibration_to_json(start)}};

    TuneState state;
    state.calibration = start;
    if (!a->fresh && fs::exists(log_path)) {
      state = tune_state_from_log(read_json_file(log_path, "tune log"), request, log_path);
      std::printf("resuming %s: %zu runs, %zu rounds done\n", log_path.c_str(), state.runs.size(), state.rounds.size());
    }

    // Plans the launcher can run: lcplan-exec's own limits (executor/scale.h); a command template runs anything.
    std::function<bool(const Plan&)> runnable = [](const Plan&) { return true; };
#ifdef LCPLAN_WITH_EXECUTOR
    if (exec) runnable = [&in](const Plan& p) { return exec::executor_support_error(in.model, p).empty(); };
#endif
    std::map<std::string, MeasuredCase> cases;  // measured runs resolved once (model, hardware), by id
    auto case_of = [&](const Measurement& m) -> const MeasuredCase& {
      auto it = cases.find(m.id);
      if (it == cases.end()) it = cases.emplace(m.id, resolve_measurements({m}, dir).at(0)).first;
      return it->second;
    };

    TuneHooks hooks;
    hooks.rank = [&](const Calibration& cal, int count, const std::set<std::string>& skip) {
      SearchOptions opt = setup.options;
      opt.top_k = count;
      opt.admit = [&](const Plan& p) { return runnable(p) && (skip.empty() || !skip.count(plan_key(p))); };
      const SearchResult r = search_plans(in.model, base, setup.space, in.hardware, cal, opt);
      if (r.top.empty()) throw UserError(explain_infeasible(r, in.hardware, opt));
      std::vector<RankedPlan> out;
      for (const Candidate& c : r.top)
        out.push_back({c.plan, plan_key(c.plan), c.estimate.time.step_seconds, c.estimate.memory.peak_bytes});
      return out;
    };
    hooks.run = [&](const RankedPlan& rp, int index) {
      char name[32];
      std::snprintf(name, sizeof name, "run-%03d", index);
      const fs::path rd = fs::path(a->run_dir) / name;
      fs::create_directories(rd);
      const RunFiles files{(rd / "measured.json").string(), (rd / "log.txt").string()};
      fs::remove(files.out);
      fs::remove(files.log);
      const std::string plan_file = (rd / "plan.json").string();
      write_file_atomic(plan_file, plan_to_json(rp.plan).dump(2) + "\n");
      const int node = rp.plan.gpus_per_node > 0 ? std::min(rp.plan.gpus_per_node, rp.plan.gpus) : rp.plan.gpus;
      const std::string mflags = flags_line(megatron_flags(rp.plan, in.model));
      const std::map<std::string, std::string> values = {
          {"plan", shell_quote(plan_file)},       {"out", shell_quote(files.out)},
          {"log", shell_quote(files.log)},        {"run_dir", shell_quote(rd.string())},
          {"id", name},                           {"gpus", std::to_string(rp.plan.gpus)},
          {"nodes", std::to_string((rp.plan.gpus + node - 1) / node)},
          {"gpus_per_node", std::to_string(node)}, {"megatron_flags", mflags},
          {"flags", mflags},                      {"megatron_model_flags", megatron_model_flags(in.model, false)}};
      TuneRun run;
      run.command = expand_launch_template(tmpl, values);
      run.log = files.log;
      std::printf("  run %d: %s  predicted %s ...\n", index, plan_label(rp.plan).c_str(), seconds_text(rp.predicted_seconds).c_str());
      std::fflush(stdout);
      const ProcessResult pr = run_shell(run.command, files.log, run_timeout);
      run.measured = read_run_measurement(pr, files, rp.plan, std::string("tune ") + name, skip_iterations);
      if (run.measured.status == MeasurementStatus::OutOfMemory)
        std::printf("         out of memory: the plan does not fit (%s)\n", run.measured.failure.c_str());
      else if (run.measured.step_seconds)
        std::printf("         measured %s (%s against the prediction)\n", seconds_text(*run.measured.step_seconds).c_str(),
                    percent(rp.predicted_seconds / *run.measured.step_seconds - 1).c_str());
      return run;
    };
    hooks.predict = [&](const Measurement& m, const Calibration& cal) {
      return predict(case_of(m), Quantity::StepSeconds, cal);
    };
    hooks.refit = [&](const std::vector<Measurement>& measured, const Calibration& current) {
      std::vector<MeasuredCase> cs;
      for (const Measurement& m : measured) cs.push_back(case_of(m));
      TuneRefitOptions ro;
      ro.keys = fit_keys;
      ro.prior_width = prior_width;
      ro.source = log_path;
      return refit_for_tune(std::move(cs), current, start, ro);
    };
    auto write_log = [&](const TuneState& s, const std::optional<TuneOutcome>& o) {
      write_file_atomic(log_path, tune_log_json(request, s, o).dump(2) + "\n");
    };
    hooks.on_run = [&](const TuneState& s) { write_log(s, std::nullopt); };
    hooks.on_round = [&](const TuneState& s) {
      write_log(s, std::nullopt);
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
          if (run.ranked.key == p.key && run.measured.step_seconds) measured = "run " + std::to_string(run.index) + " measured " + seconds_text(*run.measured.step_seconds);
        std::printf("  %zu. %-56s predicted %-10s %s\n", i + 1, plan_label(p.plan).c_str(), seconds_text(p.predicted_seconds).c_str(),
                    measured.c_str());
      }
      std::fflush(stdout);
    };

    std::printf("tune: %s on %d x %s, launcher %s, %d plans per round, at most %d runs and %d rounds\n", in.model.name.c_str(),
                base.gpus, in.hardware.name.c_str(), exec ? "exec" : "template", topt.plans_per_round, topt.max_runs,
                topt.max_rounds);
    std::fflush(stdout);
    const TuneOutcome outcome = run_tune(state, hooks, topt);
    write_log(state, outcome);

    std::printf("\nstopped: %s\n", to_string(outcome.stop));
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
    if (outcome.chosen_run == 0) {
      std::fprintf(stderr, "lcplan: no run of this tune completed with a step time (see %s)\n", log_path.c_str());
      exit_code = 1;
      return;
    }
    const TuneRun& chosen = state.runs[size_t(outcome.chosen_run - 1)];
    std::printf("chosen: run %d, %s, measured %s (the fastest measured)\n", chosen.index, plan_label(chosen.ranked.plan).c_str(),
                seconds_text(*chosen.measured.step_seconds).c_str());
    if (!a->out.empty()) write_file_atomic(a->out, plan_to_json(chosen.ranked.plan).dump(2) + "\n");
    if (!a->calibration_out.empty()) {
      nlohmann::json j = calibration_to_json(state.calibration);
      j["name"] = "tuned";
      j["description"] = "lcplan tune: " + (a->plan.calibration.empty() ? std::string("default") : a->plan.calibration) +
                         " for " + in.hardware.name + " and " + base.implementation + ", refit to " +
                         std::to_string(state.runs.size()) + " runs (" + log_path + ")";
      write_file_atomic(a->calibration_out, j.dump(2) + "\n");
    }
    std::printf("log: %s\n", log_path.c_str());
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
