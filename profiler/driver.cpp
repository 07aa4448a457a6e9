#include "profiler/driver.h"

#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "common/user_error.h"
#include "estimator/frameworks.h"

namespace lcplan::profiler {

std::vector<std::string> parse_cases(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string name;
  std::string valid;
  for (const CaseInfo& c : case_table()) valid += (valid.empty() ? "" : ", ") + std::string(c.name);
  while (std::getline(in, name, ',')) {
    bool known = false;
    for (const CaseInfo& c : case_table()) known |= name == c.name;
    if (!known) throw UserError("--cases \"" + list + "\" names unknown case \"" + name + "\" (valid: " + valid + ")");
    out.push_back(name);
  }
  if (out.empty()) throw UserError("--cases \"" + list + "\" names no case (valid: " + valid + ")");
  return out;
}

ProfileRun run_profile(Device& dev, const comm::Comm& world, const Targets& t, const std::vector<std::string>& cases,
                       const std::function<void(const std::string&)>& log) {
  ProfileRun run;
  run.data.backend = dev.backend();
  run.device = dev.description();
  const NodeInfo node = node_info(world);
  run.ranks = world.size, run.nodes = node.nodes, run.ranks_per_node = node.local_size;
  const auto start = std::chrono::steady_clock::now();
  for (const CaseInfo& info : case_table()) {
    bool chosen = cases.empty();
    for (const std::string& n : cases) chosen |= n == info.name;
    if (!chosen) continue;
    const auto t0 = std::chrono::steady_clock::now();
    CaseContext ctx{dev, world, node, t, run.data, log};
    try {
      info.run(ctx);
    } catch (const std::invalid_argument& e) {
      // A shape a kernel refuses (its argument checks are the same on every rank, so every rank stops here).
      run.data.notes.push_back(std::string("case ") + info.name + " stopped: " + e.what());
      log(std::string("case ") + info.name + " stopped: " + e.what());
    }
    comm::barrier(world);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.case_seconds.push_back({info.name, s});
    log(std::string("case ") + info.name + " done in " + std::to_string(s) + " s");
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

nlohmann::json calibration_with_profile(const nlohmann::json& start_json, const Hardware& hw, const ProfileRun& run,
                                        const Derived& derived, const Targets& t, const OutputFacts& f) {
  nlohmann::json j = start_json;
  const std::string prefix = "measured: " + f.device + " " + f.date + " `" + f.command + "`: ";
  // On a GPU, lcplan's own kernels describe lcplan-exec there, not the hardware a Megatron plan runs its vendor
  // kernels on (measured on an H200, 2026-11-27: our attention at 0.2% of peak, cuDNN's near 50%).
  const std::string exec = calibration_key("lcplan-exec");
  const bool split = run.data.backend == "cuda";
  size_t n_hw = 0, n_exec = 0;
  for (const auto& [key, m] : derived.coefficients) {
    const bool to_exec = split && m.own_kernel;
    nlohmann::json& layer = to_exec ? j["per_implementation"][exec] : j["per_hardware"][hw.name];
    if (!layer.is_object()) layer = nlohmann::json::object();
    layer[key] = {{"value", m.value}, {"provenance", prefix + m.how}};
    ++(to_exec ? n_exec : n_hw);
  }
  std::string desc = j.contains("description") && j["description"].is_string() ? j["description"].get<std::string>() : "";
  j["description"] = desc + (desc.empty() ? "" : " ") + "[per_hardware." + hw.name + ": " + std::to_string(n_hw) +
                     (n_exec ? ", per_implementation." + exec + ": " + std::to_string(n_exec) : std::string()) +
                     " coefficients measured by lcplan profile (" + run.data.backend + ") on " + f.date +
                     "; raw tables under \"profile\"]";
  nlohmann::json cases = nlohmann::json::object();
  for (const auto& [name, s] : run.case_seconds) cases[name] = s;
  std::vector<std::string> notes = t.notes;
  notes.insert(notes.end(), run.data.notes.begin(), run.data.notes.end());
  notes.insert(notes.end(), derived.notes.begin(), derived.notes.end());
  j["profile"] = {{"device", f.device},
                  {"date", f.date},
                  {"command", f.command},
                  {"backend", run.data.backend},
                  {"hardware", hw.name},
                  {"start", f.start},
                  {"plan", t.plan},
                  {"ranks", run.ranks},
                  {"nodes", run.nodes},
                  {"ranks_per_node", run.ranks_per_node},
                  {"max_call_flops", t.max_call_flops},
                  {"seconds", run.seconds},
                  {"case_seconds", cases},
                  {"fits", derived.fits},
                  {"notes", notes},
                  {"tables", to_json(run.data)}};
  (void)calibration_from_json(j, "lcplan profile output");  // the estimator must be able to read what we write
  return j;
}

std::string summary_table(const Derived& derived, const Hardware& hw, const ProfileRun& run) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "profile of %s on %d rank(s), %d node(s), %.1f s; coefficients for hardware %s:\n",
                run.data.backend.c_str(), run.ranks, run.nodes, run.seconds, hw.name.c_str());
  o << line;
  const bool split = run.data.backend == "cuda";
  for (const auto& [key, m] : derived.coefficients) {
    std::snprintf(line, sizeof line, "  %-34s %12.5g%s\n", key.c_str(), m.value,
                  split && m.own_kernel ? "  (lcplan-exec's own kernel: written per implementation)" : "");
    o << line;
  }
  for (const std::string& n : derived.notes) o << "  note: " << n << "\n";
  return o.str();
}

}  // namespace lcplan::profiler
