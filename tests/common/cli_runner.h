// Running a built binary from a test (the lcplan CLI, lcplan-exec, chromium): one process runner for every CLI test,
// with stdout and stderr captured through files, an optional working directory, time limit and user, and a scratch
// folder per test binary that is removed at exit.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lcplan::testing {

struct Outcome {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;  // wall time the child ran
};

struct RunOptions {
  std::string cwd;        // empty: the test's own
  int timeout_s = 0;      // 0: none; else the child's process group is killed then
  bool as_nobody = false; // drop to user nobody when running as root (file-permission rows)
  bool own_group = false; // start the child in a process group of its own (a signal or timeout reaches its helpers)
  std::vector<std::pair<std::string, std::string>> env;  // variables set in the child
};

// This test binary's scratch folder (created on first use, removed at exit); `tag` names it in /tmp.
const std::filesystem::path& scratch(const std::string& tag = "lcplan_test");
std::string slurp(const std::filesystem::path& p);
// Writes `text` to scratch()/name and returns the path.
std::filesystem::path write_scratch(const std::string& name, const std::string& text);

// Starts argv[0] with argv (no shell), stdout and stderr to scratch files named after `tag`; returns the child's pid.
pid_t start_program(const std::vector<std::string>& argv, const std::string& tag, const RunOptions& opt = {});
// Waits for a child start_program made (killing its group past the time limit) and reads what it wrote.
Outcome finish_program(pid_t pid, const std::string& tag, const RunOptions& opt = {});
// start_program then finish_program.
Outcome run_program(const std::vector<std::string>& argv, const RunOptions& opt = {});

// Root ignores file modes, so permission tests drop to nobody in the child (exit code 125: could not drop).
void become_nobody_if_root();

}  // namespace lcplan::testing
