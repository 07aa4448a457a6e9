#include "calibrate/megatron_log.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "common/user_error.h"

namespace lcplan {

const char* to_string(RunFailure f) {
  switch (f) {
    case RunFailure::None: return "none";
    case RunFailure::OutOfMemory: return "out_of_memory";
    case RunFailure::Nccl: return "nccl_error";
    case RunFailure::Traceback: return "exception";
  }
  return "?";
}

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The leading number of `s` (after blanks), or nothing.
std::optional<double> leading_number(const std::string& s) {
  const std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// "key: value" fields between '|' separators.
std::vector<std::pair<std::string, std::string>> fields(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find('|', b);
    if (e == std::string::npos) e = s.size();
    const std::string f = s.substr(b, e - b);
    const size_t colon = f.rfind(':');
    if (colon != std::string::npos) out.push_back({trim(f.substr(0, colon)), f.substr(colon + 1)});
    b = e + 1;
  }
  return out;
}

std::optional<long> read_long(const std::string& s, size_t& i) {
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t b = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i - b < 15) ++i;
  if (b == i) return std::nullopt;
  return std::stol(s.substr(b, i - b));
}

std::optional<MegatronIteration> iteration_line(const std::string& line) {
  const size_t elapsed = line.find("elapsed time per iteration (ms):");
  if (elapsed == std::string::npos) return std::nullopt;
  size_t at = line.rfind("iteration ", elapsed);
  // The first "iteration" word followed by N/M.
  for (size_t pos = line.find("iteration"); pos != std::string::npos && pos < elapsed; pos = line.find("iteration", pos + 1)) {
    size_t i = pos + 9;
    const auto n = read_long(line, i);
    while (i < line.size() && line[i] == ' ') ++i;
    if (!n || i >= line.size() || line[i] != '/') continue;
    ++i;
    const auto total = read_long(line, i);
    if (!total) continue;
    MegatronIteration it;
    it.iteration = *n;
    it.total = *total;
    at = i;
    bool have_elapsed = false;
    for (const auto& [key, value] : fields(line.substr(at))) {
      if (key == "elapsed time per iteration (ms)") {
        if (auto v = leading_number(value); v && *v > 0) it.elapsed_ms = *v, have_elapsed = true;
      } else if (key == "throughput per GPU (TFLOP/s/GPU)" || key == "compute per GPU (TFLOP/s/GPU)") {
        if (auto v = leading_number(value); v && *v > 0) it.tflops_per_gpu = *v;
      } else if (key == "tokens per GPU (tokens/s/GPU)" || key == "Tokens per second per GPU (Tok/s/GPU)") {
        if (auto v = leading_number(value); v && *v > 0) it.tokens_per_gpu = *v;
      } else if (key == "global batch size") {
        if (auto v = leading_number(value); v && *v >= 1 && *v < 1e12) it.global_batch = long(*v);
      } else if (key == "number of skipped iterations") {
        if (auto v = leading_number(value); v && *v >= 0 && *v < 1e12) it.skipped = long(*v);
      } else if (key == "number of nan iterations") {
        if (auto v = leading_number(value); v && *v >= 0 && *v < 1e12) it.nan = long(*v);
      }
    }
    if (!have_elapsed) return std::nullopt;
    return it;
  }
  return std::nullopt;
}

std::optional<MegatronMemory> memory_line(const std::string& line) {
  const size_t r = line.find("[Rank ");
  const size_t mb = line.find("memory (MB)");
  if (r == std::string::npos || mb == std::string::npos || mb < r) return std::nullopt;
  size_t i = r + 6;
  const auto rank = read_long(line, i);
  if (!rank || i >= line.size() || line[i] != ']' || *rank > 1 << 24) return std::nullopt;
  MegatronMemory m;
  m.rank = int(*rank);
  if (const size_t a = line.find("(after ", i); a != std::string::npos && a < mb) {
    size_t k = a + 7;
    m.after_iterations = read_long(line, k).value_or(0);
  }
  bool have_max = false;
  for (const auto& [key, value] : fields(line.substr(mb))) {
    const auto v = leading_number(value);
    if (!v || *v < 0) continue;
    if (key == "allocated") m.allocated_mib = *v;
    else if (key == "max allocated") m.max_allocated_mib = *v, have_max = true;
    else if (key == "reserved") m.reserved_mib = *v;
    else if (key == "max reserved") m.max_reserved_mib = *v;
  }
  if (!have_max) return std::nullopt;
  return m;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The plan's word for a size Megatron reports at startup, by the name on its "using world size" line or in its
// argument dump; nullptr for others.
const char* startup_size_name(const std::string& key) {
  static const std::pair<const char*, const char*> names[] = {
      {"using world size", "gpus"},           {"world_size", "gpus"},
      {"tensor-model-parallel size", "tp"},   {"tensor_model_parallel_size", "tp"},
      {"pipeline-model-parallel size", "pp"}, {"pipeline_model_parallel_size", "pp"},
      {"context-parallel size", "cp"},        {"context_parallel_size", "cp"},
      {"expert_model_parallel_size", "ep"},   {"expert_tensor_parallel_size", "etp"},
      {"seq_length", "seq_len"},              {"micro_batch_size", "micro_batch"}};
  for (const auto& [k, v] : names)
    if (key == k) return v;
  return nullptr;
}

// Sizes on a startup line: "using world size: 32, ... tensor-model-parallel size: 1, ..." or a dump line
// "  tensor_model_parallel_size ...................... 2".
void startup_sizes(const std::string& line, int line_no, std::vector<MegatronStartupSize>& out) {
  auto put = [&](const std::string& key, const std::string& value) {
    const char* name = startup_size_name(trim(key));
    size_t i = 0;
    const std::string v = trim(value);
    if (!name) return;
    if (const auto n = read_long(v, i); n && i == v.size()) out.push_back({name, *n, line_no});
  };
  if (const size_t at = line.find("using world size:"); at != std::string::npos) {
    std::string rest = line.substr(at);
    for (size_t b = 0; b <= rest.size();) {
      size_t e = rest.find(',', b);
      if (e == std::string::npos) e = rest.size();
      const std::string part = rest.substr(b, e - b);
      if (const size_t c = part.find(':'); c != std::string::npos) put(part.substr(0, c), part.substr(c + 1));
      b = e + 1;
    }
    return;
  }
  if (const size_t dots = line.find(" ....."); dots != std::string::npos) {
    const size_t end = line.find_first_not_of('.', dots + 1);
    if (end != std::string::npos) {
      const size_t word = line.find_last_of(" :]", dots - 1);
      put(line.substr(word == std::string::npos ? 0 : word + 1, dots - (word == std::string::npos ? 0 : word + 1)), line.substr(end));
    }
  }
}

// The plan's value of a startup size (dp is not compared: it follows from the rest).
long plan_size(const Plan& p, const std::string& name) {
  const Parallel& q = p.parallel;
  if (name == "gpus") return p.gpus;
  if (name == "tp") return q.tp;
  if (name == "pp") return q.pp;
  if (name == "cp") return q.cp;
  if (name == "ep") return q.ep;
  if (name == "etp") return q.etp;
  if (name == "seq_len") return long(p.seq_len);
  return p.micro_batch;
}

// The exception line of a Python traceback: "<dotted.Name>Error: ..." or "...Exception: ...".
std::optional<std::string> exception_line(const std::string& line) {
  for (const char* kind : {"Error", "Exception", "Interrupt"}) {
    size_t pos = line.find(kind);
    while (pos != std::string::npos) {
      const size_t end = pos + std::string(kind).size();
      if (end == line.size() || line[end] == ':') {
        size_t b = pos;
        while (b > 0 && (std::isalnum(static_cast<unsigned char>(line[b - 1])) || line[b - 1] == '_' || line[b - 1] == '.')) --b;
        if (b < pos || pos > 0) return trim(line.substr(b));
      }
      pos = line.find(kind, pos + 1);
    }
  }
  return std::nullopt;
}

std::string shorten(std::string s, size_t n = 300) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  s = trim(s);
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

// The reason as part of one error sentence: its first sentence only, no final period.
std::string first_sentence(const std::string& s) {
  std::string t = shorten(s, 160);
  for (size_t i = 0; i + 1 < t.size(); ++i)
    if (t[i] == '.' && t[i + 1] == ' ') return t.substr(0, i);
  while (!t.empty() && t.back() == '.') t.pop_back();
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

MegatronLog parse_megatron_log(const std::string& text) {
  MegatronLog log;
  size_t b = 0;
  int line_no = 0;
  bool in_traceback = false;
  int traceback_line = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) {
      // The last line has no newline: the writer was cut off mid-line (a killed job, a log being written).
      if (!trim(text.substr(b)).empty()) log.truncated_last_line = true;
      break;
    }
    std::string line = text.substr(b, e - b);
    b = e + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    startup_sizes(line, line_no, log.startup);
    if (auto it = iteration_line(line)) {
      it->line = line_no;
      log.iterations.push_back(*it);
      continue;
    }
    if (auto m = memory_line(line)) {
      m->line = line_no;
      log.memory.push_back(*m);
      continue;
    }
    // Failures: CUDA out of memory first (it appears inside a traceback), then NCCL, then any other exception.
    if (log.failure != RunFailure::OutOfMemory &&
        (contains(line, "CUDA out of memory") || contains(line, "OutOfMemoryError") || contains(line, "CUDA error: out of memory"))) {
      log.failure = RunFailure::OutOfMemory;
      const size_t at = std::min({line.find("CUDA"), line.find("torch."), line.find("OutOfMemoryError")});
      log.failure_reason = shorten(line.substr(at == std::string::npos ? 0 : at));
      log.failure_line = line_no;
      continue;
    }
    if (log.failure == RunFailure::None || log.failure == RunFailure::Traceback) {
      if (contains(line, "NCCL error") || contains(line, "ncclInternalError") || contains(line, "ncclSystemError") ||
          contains(line, "ncclUnhandledCudaError") || contains(line, "ncclRemoteError") ||
          contains(line, "Watchdog caught collective operation timeout")) {
        log.failure = RunFailure::Nccl;
        const size_t at = line.find("NCCL") != std::string::npos ? line.find("NCCL") : line.find("nccl");
        log.failure_reason = shorten(line.substr(at == std::string::npos ? 0 : at));
        log.failure_line = line_no;
        continue;
      }
    }
    if (contains(line, "Traceback (most recent call last)")) {
      in_traceback = true;
      traceback_line = line_no;
      continue;
    }
    if (in_traceback && log.failure == RunFailure::None && !contains(line, "File \"")) {
      if (auto ex = exception_line(line)) {
        log.failure = RunFailure::Traceback;
        log.failure_reason = shorten(*ex);
        log.failure_line = traceback_line;
        in_traceback = false;
      }
    }
  }
  return log;
}

namespace {

// The logged iterations after the warm-up ones (none when an out-of-memory run logged too few).
std::vector<const MegatronIteration*> measured_iterations(const MegatronLog& log, const IngestOptions& opt, bool oom) {
  std::vector<const MegatronIteration*> used;
  if (log.iterations.empty()) return used;
  const size_t n = log.iterations.size();
  if (opt.skip_iterations < 0 || size_t(opt.skip_iterations) >= n) {
    if (!oom)
      throw UserError(opt.file + " has " + std::to_string(n) + " iteration lines, all skipped by --skip-iterations " +
                      std::to_string(opt.skip_iterations) + " (valid: 0 to " + std::to_string(n - 1) + ")");
    return used;
  }
  for (size_t i = size_t(opt.skip_iterations); i < n; ++i) used.push_back(&log.iterations[i]);
  return used;
}

// The run must be the plan's: the sizes it reports at startup and the global batch of every iteration used.
void check_run_is_the_plan(const MegatronLog& log, const std::vector<const MegatronIteration*>& used, const Plan& plan,
                           const std::string& file) {
  std::set<std::string> compared;  // the first report of each size is the run's own
  for (const MegatronStartupSize& s : log.startup)
    if (compared.insert(s.name).second && plan_size(plan, s.name) != s.value)
      throw UserError(file + ": the run reports " + s.name + " " + std::to_string(s.value) + " (line " +
                      std::to_string(s.line) + ") but the plan's " + s.name + " is " +
                      std::to_string(plan_size(plan, s.name)) + " (give the plan this run was launched with)");
  const long plan_batch = effective_global_batch(plan);
  for (const MegatronIteration* it : used)
    if (it->global_batch && *it->global_batch != plan_batch)
      throw UserError(file + ": global batch size " + std::to_string(*it->global_batch) + " at iteration " +
                      std::to_string(it->iteration) + " disagrees with the plan's global_batch " + std::to_string(plan_batch) +
                      " (give the plan of this run)");
}

// Median step time and TFLOP/s/GPU of the iterations used.
void add_iterations(const std::vector<const MegatronIteration*>& used, const IngestOptions& opt, nlohmann::json& rec,
                    nlohmann::json& source, std::vector<std::string>& notes) {
  if (used.empty()) return;
  std::vector<double> ms, tflops, tokens;
  long bad = 0;
  for (const MegatronIteration* it : used) {
    ms.push_back(it->elapsed_ms);
    if (it->tflops_per_gpu) tflops.push_back(*it->tflops_per_gpu);
    if (it->tokens_per_gpu) tokens.push_back(*it->tokens_per_gpu);
    bad += it->skipped + it->nan;
  }
  rec["step_seconds"] = median(ms) / 1e3;
  if (!tflops.empty()) rec["tflops_per_gpu"] = median(tflops);
  else notes.push_back("no TFLOP/s field in the iteration lines (Megatron prints it with --log-throughput)");
  source["iterations"] = {used.front()->iteration, used.back()->iteration};
  source["logged_iterations_used"] = used.size();
  source["logged_iterations_skipped"] = opt.skip_iterations;
  notes.push_back("median of " + std::to_string(used.size()) + " logged iterations (" + std::to_string(used.front()->iteration) +
                  " to " + std::to_string(used.back()->iteration) + ") after skipping the first " +
                  std::to_string(opt.skip_iterations) + ": " + num(median(ms), "%.1f") + " ms per iteration" +
                  (tokens.empty() ? std::string() : ", " + num(median(tokens), "%.1f") + " tokens/s/GPU"));
  if (bad > 0) notes.push_back(std::to_string(bad) + " skipped or NaN iterations inside the intervals used");
}

// The largest max-allocated and max-reserved over the ranks' memory lines.
void add_memory(const MegatronLog& log, bool oom, nlohmann::json& rec, nlohmann::json& source,
                std::vector<std::string>& notes) {
  if (log.memory.empty()) {
    if (!oom) notes.push_back("no memory lines (Megatron prints them once per rank after the first logged iteration)");
    return;
  }
  const MegatronMemory* top = &log.memory.front();
  const MegatronMemory* top_reserved = &log.memory.front();
  std::vector<int> ranks;
  for (const MegatronMemory& m : log.memory) {
    if (m.max_allocated_mib > top->max_allocated_mib) top = &m;
    if (m.max_reserved_mib > top_reserved->max_reserved_mib) top_reserved = &m;
    if (std::find(ranks.begin(), ranks.end(), m.rank) == ranks.end()) ranks.push_back(m.rank);
  }
  constexpr double MiB = 1024.0 * 1024.0;
  if (top->max_allocated_mib > 0) rec["peak_bytes"] = top->max_allocated_mib * MiB;
  if (top_reserved->max_reserved_mib > 0) rec["peak_reserved_bytes"] = top_reserved->max_reserved_mib * MiB;
  source["peak_rank"] = top->rank;
  source["peak_reserved_rank"] = top_reserved->rank;
  source["memory_ranks"] = ranks.size();
  notes.push_back("peak = max allocated " + num(top->max_allocated_mib, "%.2f") + " MiB on rank " + std::to_string(top->rank) +
                  " (largest of " + std::to_string(ranks.size()) + " ranks); max reserved " +
                  num(top_reserved->max_reserved_mib, "%.2f") + " MiB on rank " + std::to_string(top_reserved->rank));
}

// How the run ended: out of memory (the plan did not fit), or a later failure after the iterations used.
void add_failure(const MegatronLog& log, bool oom, bool measured, nlohmann::json& rec, std::vector<std::string>& notes) {
  if (oom) {
    rec["status"] = "out_of_memory";
    rec["failure"] = log.failure_reason;
    notes.push_back("the run ran out of CUDA memory at line " + std::to_string(log.failure_line) +
                    (measured ? ", after the iterations measured" : " before any measured iteration") +
                    ": the plan did not fit");
  } else if (log.failure != RunFailure::None) {
    notes.push_back("the run failed later, at line " + std::to_string(log.failure_line) + " (" + to_string(log.failure) + ": " +
                    first_sentence(log.failure_reason) + "); the iterations before it are used");
  }
}

}  // namespace

nlohmann::json megatron_measurement(const MegatronLog& log, const Plan& plan, const IngestOptions& opt) {
  const std::string& file = opt.file;
  std::vector<std::string> notes;
  const bool oom = log.failure == RunFailure::OutOfMemory;
  const int first_line = log.iterations.empty() ? 0 : log.iterations.front().line;
  if (log.failure != RunFailure::None && !oom && (log.iterations.empty() || log.failure_line < first_line))
    throw UserError(file + ": the run failed before its first logged iteration (line " + std::to_string(log.failure_line) +
                    ", " + to_string(log.failure) + ": " + first_sentence(log.failure_reason) + ")");
  if (log.iterations.empty() && !oom)
    throw UserError(file + " has no iteration lines (Megatron-LM prints \"iteration N/M | ... | elapsed time per iteration "
                           "(ms): ...\" every --log-interval; is it the log of rank 0?)");
  if (log.truncated_last_line) notes.push_back("the last line was cut off (no newline) and ignored");

  nlohmann::json rec = {{"id", opt.id}, {"plan", plan_to_json(plan)}, {"scope", "step"}};
  nlohmann::json source = {{"kind", "megatron-log"}, {"file", file}};
  const std::vector<const MegatronIteration*> used = measured_iterations(log, opt, oom);
  check_run_is_the_plan(log, used, plan, file);
  add_iterations(used, opt, rec, source, notes);
  add_memory(log, oom, rec, source, notes);
  add_failure(log, oom, !used.empty(), rec, notes);
  if (!rec.contains("step_seconds") && !rec.contains("peak_bytes") && !oom)
    throw UserError(file + " has no usable iteration or memory values");
  rec["source"] = source;
  std::string joined;
  for (const auto& n : notes) joined += (joined.empty() ? "" : "; ") + n;
  rec["notes"] = joined;
  return rec;
}

}  // namespace lcplan
