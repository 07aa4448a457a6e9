#include "tune/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "calibrate/megatron_log.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

const std::vector<std::string>& launch_placeholders() {
  static const std::vector<std::string> names = {"plan",  "out",   "log",           "run_dir",        "id",
                                                 "gpus",  "nodes", "gpus_per_node", "megatron_flags", "flags",
                                                 "megatron_model_flags"};
  return names;
}

namespace {

// Splits a template into literal text and placeholder names; `visit(is_name, text)` sees each piece in order.
template <typename F>
void scan_template(const std::string& t, F&& visit) {
  std::string lit;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '{' && i + 1 < t.size() && t[i + 1] == '{') {
      lit += '{', ++i;
    } else if (t[i] == '}' && i + 1 < t.size() && t[i + 1] == '}') {
      lit += '}', ++i;
    } else if (t[i] == '{') {
      const size_t end = t.find('}', i);
      if (end == std::string::npos)
        throw UserError("--launcher template has an unclosed \"{\" at character " + std::to_string(i + 1) +
                        " (write {{ for a literal brace)");
      visit(false, lit);
      lit.clear();
      visit(true, t.substr(i + 1, end - i - 1));
      i = end;
    } else {
      lit += t[i];
    }
  }
  visit(false, lit);
}

std::string known_list() {
  std::string s;
  for (const std::string& n : launch_placeholders()) s += (s.empty() ? "{" : ", {") + n + "}";
  return s;
}

// The last non-empty line of a file (its tail only), for the sentence that says why a run failed.
std::string last_line(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(tail);
  std::string line, last;
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return last;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Set by the handler while run_shell waits; a signal handler can only touch a lock-free flag.
volatile sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

}  // namespace

void check_launch_template(const std::string& tmpl) {
  bool names_plan = false;
  scan_template(tmpl, [&](bool is_name, const std::string& text) {
    if (!is_name) return;
    const auto& known = launch_placeholders();
    if (std::find(known.begin(), known.end(), text) == known.end())
      throw UserError("--launcher template names an unknown placeholder {" + text + "} (valid: " + known_list() + ")");
    names_plan = names_plan || text == "plan" || text == "megatron_flags" || text == "flags";
  });
  if (!names_plan)
    throw UserError("--launcher template \"" + tmpl +
                    "\" names no plan placeholder ({plan}, {megatron_flags} or {flags}), so every run would be the same "
                    "command; add one");
}

std::string expand_launch_template(const std::string& tmpl, const std::map<std::string, std::string>& values) {
  std::string out;
  scan_template(tmpl, [&](bool is_name, const std::string& text) {
    if (!is_name) {
      out += text;
      return;
    }
    const auto it = values.find(text);
    if (it == values.end()) throw UserError("--launcher template names {" + text + "}, which has no value here (valid: " + known_list() + ")");
    out += it->second;
  });
  return out;
}

std::string shell_quote(const std::string& s) {
  const bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("@%+=:,./-_", c) != nullptr;
  });
  if (safe) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ProcessResult run_shell(const std::string& command, const std::string& log_path, double timeout_seconds) {
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot open the run log " + log_path + ": " + std::strerror(errno));
  struct sigaction act {}, old_int {}, old_term {};
  act.sa_handler = on_stop_signal;
  sigemptyset(&act.sa_mask);
  g_stop_signal = 0;
  ::sigaction(SIGINT, &act, &old_int);
  ::sigaction(SIGTERM, &act, &old_term);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a time limit or an interrupt stops mpirun and everything it started
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(fd);
  if (pid < 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    throw UserError(std::string("cannot start a shell for the run: ") + std::strerror(errno));
  }
  ::setpgid(pid, pid);  // also here: whichever of parent and child runs first
  ProcessResult r;
  int status = 0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double kill_at = -1;  // when SIGKILL follows the SIGTERM already sent
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (kill_at < 0 && (g_stop_signal != 0 || elapsed() > timeout_seconds)) {
      r.interrupted = g_stop_signal != 0;
      r.timed_out = !r.interrupted;
      ::kill(-pid, SIGTERM);
      kill_at = elapsed() + 10;  // a grace period for mpirun to stop its ranks
    } else if (kill_at >= 0 && elapsed() > kill_at) {
      ::kill(-pid, SIGKILL);
      kill_at = 1e300;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);  // anything the command left running in its group
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  r.seconds = elapsed();
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  return r;
}

Measurement read_run_measurement(const ProcessResult& pr, const RunFiles& files, const Plan& plan, const std::string& id,
                                 int skip_iterations) {
  const std::string where = "run " + id + " (log " + files.log + ")";
  if (pr.interrupted) throw UserError(where + " was interrupted; run the same command again to resume the tune");
  if (pr.timed_out) throw UserError(where + " did not finish within the time limit (--run-timeout) and was stopped");
  std::error_code ec;
  if (pr.exit_status == 0 && std::filesystem::is_regular_file(files.out, ec)) {
    std::vector<Measurement> ms = load_measurements(files.out);
    if (ms.size() != 1)
      throw UserError(where + " wrote " + std::to_string(ms.size()) + " measurement records to " + files.out +
                      " (a run writes one)");
    Measurement m = ms.front();
    m.id = id;
    return m;
  }
  // No record: the log is a Megatron-LM training log (or it says why the run failed).
  MegatronLog log = parse_megatron_log(read_text(files.log));
  if (pr.exit_status != 0 && log.failure != RunFailure::OutOfMemory) {
    const std::string why = log.failure != RunFailure::None ? log.failure_reason : last_line(files.log);
    throw UserError(where + " failed with exit status " + std::to_string(pr.exit_status) +
                    (why.empty() ? "" : ": " + why));
  }
  IngestOptions opt;
  opt.id = id;
  opt.file = files.log;
  opt.skip_iterations = skip_iterations;
  try {
    return measurement_from_json(megatron_measurement(log, plan, opt), where);
  } catch (const UserError& e) {
    throw UserError(where + " left no measurement record at " + files.out + " and its log is not a usable Megatron-LM "
                    "training log: " + e.what());
  }
}

}  // namespace lcplan
