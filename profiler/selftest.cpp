#include "profiler/selftest.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/json_file.h"
#include "common/user_error.h"

extern char** environ;

namespace lcplan::profiler {

std::vector<GpuTest> parse_gpu_test_manifest(const std::string& text, const std::string& build_dir) {
  std::vector<GpuTest> out;
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    for (size_t a = 0;;) {
      const size_t b = line.find('\t', a);
      f.push_back(line.substr(a, b == std::string::npos ? std::string::npos : b - a));
      if (b == std::string::npos) break;
      a = b + 1;
    }
    const std::string at = std::string(kGpuTestManifest) + " line " + std::to_string(no);
    if (f.size() != 3 || f[0].empty() || f[1].empty())
      throw UserError(at + " is \"" + line + "\": want name<TAB>binary relative to the build tree<TAB>MPI ranks");
    if (f[1][0] == '/')
      throw UserError(at + " names the absolute path \"" + f[1] + "\": want a path relative to the build tree");
    char* endp = nullptr;
    const long np = std::strtol(f[2].c_str(), &endp, 10);
    if (f[2].empty() || *endp != '\0' || np < 0 || np > 64)
      throw UserError(at + " gives MPI ranks \"" + f[2] + "\": want a whole number from 0 to 64");
    out.push_back({f[0], (std::filesystem::path(build_dir) / f[1]).string(), int(np)});
  }
  std::sort(out.begin(), out.end(), [](const GpuTest& a, const GpuTest& b) { return a.name < b.name; });
  return out;
}

std::vector<GpuTest> read_gpu_tests(const std::string& build_dir) {
  const std::string path = (std::filesystem::path(build_dir) / kGpuTestManifest).string();
  if (!std::filesystem::is_regular_file(path))
    throw UserError("\"" + build_dir + "\" has no " + kGpuTestManifest +
                    " (give the build tree holding the CUDA tests, configured by this source tree's CMake)");
  return parse_gpu_test_manifest(read_text_file(path, "the GPU test manifest"), build_dir);
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
