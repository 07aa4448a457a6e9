// lcplan calibrate: fit calibration coefficients to measured runs (least squares) and report the fit error.
#include <cstdio>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "cli/plan_flags.h"
#include "calibrate/calibrate_fit.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

using cli::parse_number;

namespace {
struct CalibrateArgs {
  std::string measurements;
  std::string out;
  std::string implementation;
  std::string fit;
  bool no_loo = false;
  std::string huber = "0";
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

void register_calibrate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CalibrateArgs>();
  auto* cmd = app.add_subcommand("calibrate", "fit calibration coefficients to measured runs (memory and time)");
  cmd->add_option("--measurements", args->measurements, "measurements JSON (array of {id, plan, peak_bytes|step_seconds|tflops_per_gpu})")
      ->required();
  cmd->add_option("--out", args->out, "write the fitted calibration JSON here")->required();
  cmd->add_option("--implementation", args->implementation,
                  "starting calibration profile (megatron, bumblebee, lcplan or a path); default: the plans' implementation");
  cmd->add_option("--fit", args->fit, "comma-separated coefficients to fit (default: every fittable one)");
  cmd->add_flag("--no-loo", args->no_loo, "skip the leave-one-out refits");
  cmd->add_option("--huber", args->huber,
                  "pseudo-Huber loss: relative errors beyond this (e.g. 0.05) count linearly, so one outlier run "
                  "cannot drag the fit (default 0: plain least squares)");
  cmd->callback([args, &exit_code]() {
    const double huber = parse_number(args->huber, "--huber", 0, 1, "0 to 1, e.g. 0.05; 0 = plain least squares");
    const std::string dir = data_dir();
    std::vector<Measurement> ms;
    size_t did_not_fit = 0;
    // Runs that ran out of memory measured nothing to fit: they say the plan does not fit (a tune loop's input).
    for (Measurement& m : load_measurements(args->measurements)) {
      if (m.status == MeasurementStatus::Ok) ms.push_back(std::move(m));
      else ++did_not_fit;
    }
    if (ms.empty())
      throw UserError(args->measurements + " holds only runs that ran out of memory (status out_of_memory); nothing to fit");
    std::string impl = args->implementation;
    if (impl.empty()) {
      impl = ms.front().plan.implementation;
      for (const Measurement& m : ms)
        if (m.plan.implementation != impl)
          throw UserError("measurements use implementations \"" + impl + "\" and \"" + m.plan.implementation +
                          "\"; choose the starting profile with --implementation");
    }
    const Calibration start = load_calibration(impl, dir);
    FitOptions opt;
    opt.keys = split_keys(args->fit);
    opt.source = args->measurements;
    opt.leave_one_out = !args->no_loo;
    opt.huber_delta = huber;
    const FitResult r = fit_calibration(resolve_measurements(ms, dir), start, opt);
    nlohmann::json j = calibration_to_json(r.calibration);
    j["description"] = "fitted by lcplan calibrate from " + args->measurements + " starting from " + impl;
    write_file_atomic(args->out, j.dump(2) + "\n");  // first: a failed write must leave no report on stdout
    if (did_not_fit > 0) std::printf("skipped %zu measurements with status out_of_memory (nothing measured to fit)\n", did_not_fit);
    std::fputs(fit_report(r).c_str(), stdout);
    std::printf("wrote %s\n", args->out.c_str());
    exit_code = 0;
  });
}

}  // namespace lcplan
