#include "profiler/selftest.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>

extern char** environ;

namespace lcplan::profiler {

int mpi_test_ranks(const std::string& name) {
  // tests/moe, tests/linear_ce and tests/executor CMakeLists.txt: MPI_NP 2.
  if (name == "test_moe_cuda" || name == "linear_ce_cuda_vocab_parallel_test" ||
      name == "executor_param_store_cuda_test")
    return 2;
  return 0;
}

std::vector<GpuTest> find_gpu_tests(const std::string& build_dir) {
  namespace fs = std::filesystem;
  std::vector<GpuTest> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(build_dir, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.string().find("CMakeFiles") != std::string::npos) continue;
    std::error_code e2;
    if (!fs::is_regular_file(p, e2) || ::access(p.c_str(), X_OK) != 0) continue;
    const std::string n = p.filename().string();
    const bool ends_cuda_test = n.size() > 10 && n.compare(n.size() - 10, 10, "_cuda_test") == 0;
    const bool ends_cuda = n.size() > 5 && n.compare(n.size() - 5, 5, "_cuda") == 0 && n.rfind("test_", 0) == 0;
    const bool mpi_cuda_test = n.find("_cuda_") != std::string::npos && n.size() > 5 && n.compare(n.size() - 5, 5, "_test") == 0;
    if (ends_cuda_test || ends_cuda || mpi_cuda_test) out.push_back({n, p.string(), mpi_test_ranks(n)});
  }
  std::sort(out.begin(), out.end(), [](const GpuTest& a, const GpuTest& b) { return a.name < b.name; });
  return out;
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::Fail: return "FAIL";
    case Verdict::Skipped: return "skipped";
  }
  return "FAIL";
}

Verdict classify(int status, const std::string& output) {
  if (status != 0) return Verdict::Fail;
  const bool ran = output.find("[       OK ]") != std::string::npos;
  const bool skipped = output.find("[  SKIPPED ]") != std::string::npos;
  return !ran && skipped ? Verdict::Skipped : Verdict::Pass;
}

TestRun run_captured(const std::vector<std::string>& argv, double timeout_seconds) {
  TestRun r;
  int fds[2];
  if (::pipe(fds) != 0) {
    r.output = "pipe failed";
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    r.status = 127;
    r.output = "cannot start " + argv[0];
    return r;
  }
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const double left = timeout_seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, int(std::min(left, 1.0) * 1000) + 1);
    if (n < 0 && errno != EINTR) break;
    if (n > 0) {
      const ssize_t got = ::read(fds[0], buf, sizeof buf);
      if (got <= 0) break;  // EOF: the child closed its output
      r.output.append(buf, size_t(got));
    }
  }
  ::close(fds[0]);
  // The child closed its output (or ran out of time): wait for it, still within the deadline.
  int st = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &st, timed_out ? 0 : WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (w == 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_seconds) {
        ::kill(pid, SIGKILL);
        timed_out = true;
      } else {
        ::usleep(10000);
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = timed_out ? 124 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace lcplan::profiler
