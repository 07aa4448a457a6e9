// lcplan: plan long-context MoE training. `lcplan <command> --help` for each command.
// The planner links no CUDA or MPI library; `profile` and `selftest` run in lcplan-profile, which it executes.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "cli/run_command_line.h"

namespace {

// Replaces this process with lcplan-profile beside this binary, same arguments: under mpirun the rank keeps its
// process id and environment, and the user keeps typing `lcplan profile ...`. Returns only when that fails.
int exec_profile_binary(char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string path = n > 0 ? std::string(self, size_t(n)) : std::string(argv[0]);
  path = path.substr(0, path.find_last_of('/') + 1) + "lcplan-profile";
  ::execv(path.c_str(), argv);
  std::fprintf(stderr, "lcplan: error: %s needs %s, which cannot start: %s (build the lcplan-profile target)\n", argv[1],
               path.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef LCPLAN_HAVE_PROFILER
  if (argc > 1 && (std::string(argv[1]) == lcplan::cli::kProfileCommand || std::string(argv[1]) == lcplan::cli::kSelftestCommand))
    return exec_profile_binary(argv);
#endif
  CLI::App app{"lcplan: memory and speed of parallel recipes for long-context MoE training"};
  app.require_subcommand(1);
  int exit_code = 0;
  lcplan::cli::register_models(app, exit_code);
  lcplan::cli::register_estimate(app, exit_code);
  lcplan::cli::register_search(app, exit_code);
  lcplan::cli::register_report(app, exit_code);
  lcplan::cli::register_tune(app, exit_code);
  lcplan::register_calibrate(app, exit_code);
  lcplan::register_validate(app, exit_code);
  lcplan::register_ingest(app, exit_code);
#ifdef LCPLAN_WITH_EXECUTOR
  lcplan::cli::register_diff(app, exit_code);
#endif
  // lcplan --version: the release and the commit it was built from (CMake reads it when the build is configured).
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("lcplan %s (commit %s)\n", LCPLAN_VERSION, LCPLAN_GIT_COMMIT);
    return 0;
  }
#ifdef LCPLAN_HAVE_PROFILER
  // Listed for `lcplan --help` and the unknown-command sentence; never parsed here (executed above).
  app.add_subcommand(lcplan::cli::kProfileCommand, lcplan::cli::kProfileAbout);
  app.add_subcommand(lcplan::cli::kSelftestCommand, lcplan::cli::kSelftestAbout);
#endif
  return lcplan::cli::run_command_line(app, argc, argv, exit_code);
}
