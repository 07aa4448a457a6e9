// Each subcommand registers itself on the app; its callback sets exit_code. UserError escapes to main.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace lcplan::cli {

void register_models(CLI::App& app, int& exit_code);
void register_estimate(CLI::App& app, int& exit_code);
void register_search(CLI::App& app, int& exit_code);

}  // namespace lcplan::cli

namespace lcplan {
void register_calibrate(CLI::App& app, int& exit_code);  // cli/cmd_calibrate.cpp
void register_validate(CLI::App& app, int& exit_code);   // cli/cmd_validate.cpp
// `command` is the command line as run, for the measured coefficients' provenance.
void register_profile(CLI::App& app, int& exit_code, std::string command);   // cli/cmd_profile.cpp
void register_selftest(CLI::App& app, int& exit_code);                       // cli/cmd_selftest.cpp
}
