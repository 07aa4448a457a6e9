// lcplan calibrate: fit a calibration profile to measured runs (regularized least squares) and report the fit.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "calibrate/calibrate_fit.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

using cli::parse_number;

namespace {
struct CalibrateArgs {
  std::vector<std::string> measurements;
  std::string out;
  std::string start = "default";
  std::string priors = "priors";
  std::string fit, per_hardware, per_implementation;
  bool no_loo = false;
  std::string huber;
};

std::vector<std::string> split_keys(const std::string& s) {
  std::vector<std::string> keys;
  std::stringstream in(s);
  std::string k;
  while (std::getline(in, k, ','))
    if (!k.empty()) keys.push_back(k);
  return keys;
}
}  // namespace

std::vector<MeasuredCase> load_cases(const std::vector<std::string>& files, std::vector<Measurement>* not_modelled,
                                     std::vector<MeasuredCase>* out_of_memory) {
  std::vector<Measurement> all, oom;
  for (const std::string& f : files) {
    std::vector<Measurement> ms = load_measurements(f);
    for (Measurement& m : ms) {
      // A run that ran out of memory measured nothing to fit: it says the plan does not fit, which validate checks.
      if (m.status != MeasurementStatus::Ok) {
        if (out_of_memory && m.not_modelled.empty()) {
          oom.push_back(std::move(m));
          continue;
        }
        if (m.not_modelled.empty()) m.not_modelled = "the run did not complete (" + m.failure + ")";
        if (not_modelled) not_modelled->push_back(m);
        continue;
      }
      if (!m.not_modelled.empty() && not_modelled) not_modelled->push_back(m);
      all.push_back(std::move(m));
    }
  }
  if (out_of_memory) *out_of_memory = resolve_measurements(oom, data_dir(), not_modelled);
  return resolve_measurements(all, data_dir(), not_modelled);
}

void register_calibrate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CalibrateArgs>();
  auto* cmd = app.add_subcommand("calibrate", "fit a calibration profile to measured runs (memory and time)");
  cmd->add_option("--measurements", args->measurements,
                  "measurement JSON files (arrays of {id, plan, peak_bytes|step_seconds|tflops_per_gpu})")
      ->required();
  cmd->add_option("--out", args->out, "write the fitted calibration profile here")->required();
  cmd->add_option("--start", args->start, "profile to start from (default: default)");
  cmd->add_option("--priors", args->priors, "prior profile: values and log_sigma widths (default: priors)");
  cmd->add_option("--fit", args->fit, "comma-separated base coefficients to fit (default: the start profile's fit spec)");
  cmd->add_option("--per-hardware", args->per_hardware, "comma-separated coefficients fitted per hardware profile");
  cmd->add_option("--per-implementation", args->per_implementation, "comma-separated coefficients fitted per implementation");
  cmd->add_flag("--no-loo", args->no_loo, "skip the leave-one-out refits");
  cmd->add_option("--huber", args->huber,
                  "pseudo-Huber loss: relative errors beyond this (e.g. 0.05) count linearly, so one outlier run "
                  "cannot drag the fit (default: the fit spec's, 0.05)");
  cmd->callback([args, &exit_code]() {
    const std::string dir = data_dir();
    const double huber = args->huber.empty() ? -1 : parse_number(args->huber, "--huber", 0, 1, "0 to 1, e.g. 0.05; 0 = plain least squares");
    std::vector<Measurement> skipped;
    const std::vector<MeasuredCase> cases = load_cases(args->measurements, &skipped);
    if (!skipped.empty())
      std::fprintf(stderr, "note: %zu measurements are not modelled and not fitted (first: %s: %s)\n", skipped.size(),
                   skipped.front().id.c_str(), skipped.front().not_modelled.c_str());
    const Calibration start = load_calibration(args->start, dir);
    const Calibration priors = load_calibration(args->priors, dir);
    FitOptions opt;
    if (!args->fit.empty() || !args->per_hardware.empty() || !args->per_implementation.empty()) {
      opt.spec.keys = split_keys(args->fit);
      opt.spec.per_hardware = split_keys(args->per_hardware);
      opt.spec.per_implementation = split_keys(args->per_implementation);
    } else if (!start.fit.is_null()) {
      opt.spec = fit_spec_from_json(start.fit);
    } else {
      throw UserError("calibration \"" + args->start +
                      "\" records no fit spec; name the coefficients to fit with --fit (and --per-hardware, --per-implementation)");
    }
    if (huber >= 0) opt.spec.huber_delta = huber;
    std::string source;
    for (const std::string& f : args->measurements) source += (source.empty() ? "" : ", ") + f;
    opt.source = source;
    opt.leave_one_out = !args->no_loo;
    const FitResult r = fit_calibration(cases, start, priors, opt);
    nlohmann::json j = calibration_to_json(r.calibration);
    j["name"] = start.name;
    j["description"] = "fitted by lcplan calibrate from " + source + " starting from " + args->start + " with priors " +
                       args->priors;
    write_file_atomic(args->out, j.dump(2) + "\n");  // first: a failed write must leave no report on stdout
    const size_t did_not_fit = size_t(std::count_if(skipped.begin(), skipped.end(),
                                                    [](const Measurement& m) { return m.status == MeasurementStatus::OutOfMemory; }));
    if (did_not_fit > 0) std::printf("skipped %zu measurements with status out_of_memory (nothing measured to fit)\n", did_not_fit);
    std::fputs(fit_report(r).c_str(), stdout);
    std::printf("wrote %s\n", args->out.c_str());
    exit_code = 0;
  });
}

}  // namespace lcplan
