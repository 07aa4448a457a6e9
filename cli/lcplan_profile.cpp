// lcplan-profile: the commands that need MPI and the GPU libraries (`lcplan profile`, `lcplan selftest`), kept out
// of the planner so that `lcplan models`, `estimate` or `search` load none of them. `lcplan profile ...` executes
// this binary with its own arguments; it can also be run directly (`lcplan-profile profile ...`).
#include <string>

#include "cli/commands.h"
#include "cli/run_command_line.h"

int main(int argc, char** argv) {
  CLI::App app{"lcplan: the GPU and MPI commands (profile, selftest)", "lcplan"};
  app.require_subcommand(1);
  int exit_code = 0;
  // The command as the user runs it, for the measured coefficients' provenance.
  std::string command = "lcplan";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    command += " " + (a.find_first_of(" \t'\"") == std::string::npos && !a.empty() ? a : "'" + a + "'");
  }
  lcplan::register_profile(app, exit_code, command);
  lcplan::register_selftest(app, exit_code);
  return lcplan::cli::run_command_line(app, argc, argv, exit_code);
}
