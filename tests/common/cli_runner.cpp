#include "tests/common/cli_runner.h"

#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace lcplan::testing {

namespace {

constexpr unsigned kNobody = 65534;

struct ScratchDir {
  fs::path dir;
  ~ScratchDir() {
    // Forked children leave through execv or _Exit, so only the test process removes it.
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

int exit_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

}  // namespace

const fs::path& scratch(const std::string& tag) {
  static ScratchDir s;
  if (s.dir.empty()) {
    s.dir = fs::temp_directory_path() / (tag + "." + std::to_string(::getpid()));
    fs::create_directories(s.dir);
  }
  return s.dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path write_scratch(const std::string& name, const std::string& text) {
  const fs::path p = scratch() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

void become_nobody_if_root() {
  if (::geteuid() != 0) return;
  if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) std::_Exit(125);
}

pid_t start_program(const std::vector<std::string>& argv, const std::string& tag, const RunOptions& opt) {
  const fs::path out = scratch() / (tag + ".out"), err = scratch() / (tag + ".err");
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) std::_Exit(126);
    if (opt.own_group || opt.timeout_s > 0) ::setpgid(0, 0);
    if (!opt.cwd.empty() && ::chdir(opt.cwd.c_str()) != 0) std::_Exit(126);
    for (const auto& [name, value] : opt.env) ::setenv(name.c_str(), value.c_str(), 1);
    if (opt.as_nobody) become_nobody_if_root();
    std::vector<std::string> copy = argv;
    std::vector<char*> args;
    for (auto& a : copy) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  return pid;
}

Outcome finish_program(pid_t pid, const std::string& tag, const RunOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::seconds(opt.timeout_s);
  int st = 0;
  if (opt.timeout_s <= 0) {
    ::waitpid(pid, &st, 0);
  } else {
    while (::waitpid(pid, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  Outcome r;
  r.status = exit_status(st);
  r.out = slurp(scratch() / (tag + ".out"));
  r.err = slurp(scratch() / (tag + ".err"));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Outcome run_program(const std::vector<std::string>& argv, const RunOptions& opt) {
  static int n = 0;
  const std::string tag = "run" + std::to_string(++n);
  return finish_program(start_program(argv, tag, opt), tag, opt);
}

}  // namespace lcplan::testing
