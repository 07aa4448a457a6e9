// Each subcommand registers itself on the app; its callback sets exit_code. UserError escapes to main.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "calibrate/measurement.h"

namespace lcplan::cli {

void register_models(CLI::App& app, int& exit_code);
void register_estimate(CLI::App& app, int& exit_code);
void register_search(CLI::App& app, int& exit_code);
void register_report(CLI::App& app, int& exit_code);
void register_tune(CLI::App& app, int& exit_code);  // cli/cmd_tune.cpp
void register_diff(CLI::App& app, int& exit_code);  // cli/cmd_diff.cpp (built with the executor's scale rules)

}  // namespace lcplan::cli

namespace lcplan {
void register_calibrate(CLI::App& app, int& exit_code);  // cli/cmd_calibrate.cpp
void register_validate(CLI::App& app, int& exit_code);   // cli/cmd_validate.cpp
void register_ingest(CLI::App& app, int& exit_code);     // cli/cmd_ingest.cpp

// The measured runs of `files` resolved (cli/cmd_calibrate.cpp): rows marked not_modelled, and runs that did not
// complete when `out_of_memory` is null, go to `not_modelled`; out-of-memory runs go to `out_of_memory` when given.
std::vector<MeasuredCase> load_cases(const std::vector<std::string>& files, std::vector<Measurement>* not_modelled,
                                     std::vector<MeasuredCase>* out_of_memory = nullptr);

// cli/cmd_validate_run.cpp (built with the executor): `lcplan validate --plan recipe.json --measured measured.json
// [--implementation P] [--calibration C] [--json]`.
struct ValidateRunArgs {
  std::string plan, measured, implementation;  // implementation: "" = the measurement plan's
  std::string calibration;                      // "" = default
  std::string hardware;                         // "" = the plan's (time compares only on the run's device)
  bool json = false;
};
// The comparison of every record in the measurements file with the estimate of its (scaled) plan, as text or JSON.
// Throws UserError naming a bad file, a record for a different plan, or an unknown profile.
std::string validate_run(const ValidateRunArgs& a, const std::string& data_dir);
// `command` is the command line as run, for the measured coefficients' provenance.
void register_profile(CLI::App& app, int& exit_code, std::string command);   // cli/cmd_profile.cpp
void register_selftest(CLI::App& app, int& exit_code);                       // cli/cmd_selftest.cpp
}
