// lcplan validate: a calibration profile against measured runs: per run predicted vs measured, in sample and with
// the profile refitted without each model and each hardware; summary errors and the error band.
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "calibrate/validate.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {


namespace {
// The profile file's own description, kept when the profile is rewritten with its bands.
std::string load_json_description(const std::string& name_or_path, const std::string& dir) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  const nlohmann::json j = read_json_file(is_path ? name_or_path : dir + "/data/calibration/" + name_or_path + ".json",
                                          "calibration file");
  return j.contains("description") && j.at("description").is_string() ? j.at("description").get<std::string>() : "";
}

struct ValidateArgs {
  std::vector<std::string> measurements;
  std::string calibration = "default";
  std::string priors = "priors";
  bool no_refit = false, json = false;
  std::string out, out_profile, max_in_sample, max_lomo, max_memory;
  ValidateRunArgs run;  // --plan/--measured: one run against its estimate
};
}  // namespace

void register_validate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ValidateArgs>();
  auto* cmd = app.add_subcommand("validate", "predicted vs measured per run, leave one model / hardware out");
  auto* corpus = cmd->add_option("--measurements", args->measurements, "measurement JSON files (a corpus of runs)");
  auto* measured = cmd->add_option("--measured", args->run.measured,
                                   "one run's measurement file (lcplan-exec --out) to compare with its plan's estimate, "
                                   "per memory category and phase");
  corpus->excludes(measured);
  cmd->add_option("--plan", args->run.plan, "with --measured: the recipe.json the run was launched with");
  cmd->add_option("--implementation", args->run.implementation,
                  "with --measured: the profile's implementation (default: the measurement plan's)");
  cmd->add_option("--hardware", args->run.hardware,
                  "with --measured: hardware profile of the estimate (default: the plan's); time compares only on "
                  "the device the run used, e.g. cpu-amd-epyc-2c with --calibration cpu-measured for lcplan-exec");
  cmd->add_option("--calibration", args->calibration, "profile to validate (default: default)");
  cmd->add_option("--priors", args->priors, "prior profile the refits start from (default: priors)");
  cmd->add_flag("--no-refit", args->no_refit, "in-sample errors only (no leave-one-out refits)");
  cmd->add_flag("--json", args->json, "print the report as JSON");
  cmd->add_option("--out", args->out, "also write the JSON report here");
  cmd->add_option("--out-profile", args->out_profile,
                  "write the validated profile here with its error bands (the estimates' bands) set from this run");
  cmd->add_option("--max-in-sample", args->max_in_sample, "exit 1 when the in-sample time error exceeds this (e.g. 0.10)");
  cmd->add_option("--max-lomo", args->max_lomo, "exit 1 when the leave-one-model-out time error exceeds this (e.g. 0.15)");
  cmd->add_option("--max-memory", args->max_memory, "exit 1 when the in-sample peak-memory error exceeds this (e.g. 0.10)");
  cmd->callback([args, &exit_code]() {
    const std::string dir = data_dir();
    if (!args->run.measured.empty()) {
      if (args->run.plan.empty()) throw UserError("--measured needs --plan, the recipe.json the run was launched with");
      args->run.calibration = args->calibration;
      args->run.json = args->json;
#ifdef LCPLAN_WITH_EXECUTOR
      std::fputs(validate_run(args->run, dir).c_str(), stdout);
      exit_code = 0;
      return;
#else
      throw UserError("--measured compares an lcplan-exec run and needs the executor, which this build leaves out "
                      "(build with MPI)");
#endif
    }
    for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--plan", args->run.plan},
                                      {"--implementation", args->run.implementation},
                                      {"--hardware", args->run.hardware}})
      if (!value.empty()) throw UserError(std::string(flag) + " goes with --measured");
    if (args->measurements.empty())
      throw UserError("give --measurements FILE... (a corpus of runs) or --measured FILE --plan recipe.json (one run)");
    auto limit = [](const std::string& v, const char* flag) {
      return v.empty() ? -1.0 : cli::parse_number(v, flag, 0, 10, "a relative error such as 0.15");
    };
    const double max_in = limit(args->max_in_sample, "--max-in-sample"), max_lomo = limit(args->max_lomo, "--max-lomo"),
                 max_mem = limit(args->max_memory, "--max-memory");
    std::vector<Measurement> not_modelled;
    std::vector<MeasuredCase> out_of_memory;
    const std::vector<MeasuredCase> cases = load_cases(args->measurements, &not_modelled, &out_of_memory);
    if (cases.empty() && out_of_memory.empty())
      throw UserError("no measurement lcplan can model was given (every one is marked not_modelled)");
    const Calibration profile = load_calibration(args->calibration, dir);
    for (const std::vector<MeasuredCase>* cs : {&cases, static_cast<const std::vector<MeasuredCase>*>(&out_of_memory)})
      for (const MeasuredCase& c : *cs) require_known_implementation(profile, c.meas.plan.implementation);
    const Calibration priors = load_calibration(args->priors, dir);
    ValidateOptions opt;
    opt.refit = !args->no_refit && !cases.empty();
    for (const std::string& f : args->measurements) opt.source += (opt.source.empty() ? "" : ", ") + f;
    const ValidationReport r = validate_profile(cases, not_modelled, profile, priors, opt, out_of_memory);
    const nlohmann::json j = validation_json(r);
    if (!args->out.empty()) write_file_atomic(args->out, j.dump(2) + "\n");
    if (!args->out_profile.empty()) {
      Calibration banded = profile;
      banded.time_band = r.time_band;
      banded.memory_band = r.memory_band;
      nlohmann::json pj = calibration_to_json(banded);
      pj["description"] = load_json_description(args->calibration, dir);
      write_file_atomic(args->out_profile, pj.dump(2) + "\n");
    }
    std::fputs(args->json ? (j.dump(2) + "\n").c_str() : validation_table(r).c_str(), stdout);
    exit_code = 0;
    auto over = [&](double value, double max, const char* what) {
      if (max >= 0 && !(value <= max)) {
        std::fprintf(stderr, "lcplan: %s error %.1f%% exceeds the limit %.1f%%\n", what, 100 * value, 100 * max);
        exit_code = 1;
      }
    };
    over(r.time_in_sample, max_in, "in-sample time");
    if (r.refitted) over(r.time_lomo, max_lomo, "leave-one-model-out time");
    if (r.memory_rows > 0) over(r.memory_in_sample, max_mem, "in-sample peak-memory");
  });
}

}  // namespace lcplan
