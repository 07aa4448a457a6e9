// The part of main both binaries share (`lcplan` and `lcplan-profile`): the command line checked against the
// registered commands, parsed, and every failure turned into one sentence on stderr with its exit status.
#pragma once

#include <CLI/CLI.hpp>

namespace lcplan::cli {

// Parses argv into `app` and runs the chosen command's callback. Returns `exit_code` (what the callback set), 2 for
// bad input (one sentence on stderr), 3 for an internal error; help requests print and return 0.
int run_command_line(CLI::App& app, int argc, char** argv, const int& exit_code);

}  // namespace lcplan::cli
