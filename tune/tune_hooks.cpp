#include "tune/tune_hooks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "calibrate/measurement.h"
#include "common/json_file.h"
#include "estimator/derived_plan.h"
#include "estimator/estimate.h"
#include "estimator/frameworks.h"
#include "common/user_error.h"
#include "search/emit.h"
#include "search/megatron_args.h"
#include "tune/launcher.h"

namespace lcplan {

namespace fs = std::filesystem;

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.3f s" : "%.1f s", s);
  return buf;
}

// The placeholders' values for one run (tune/launcher.h).
std::map<std::string, std::string> launch_values(const TuneSetup& s, const Plan& p, const fs::path& run_dir,
                                                 const RunFiles& files, const std::string& plan_file,
                                                 const std::string& id) {
  const int node = std::min(nvlink_domain_gpus(p, s.hardware), p.gpus);
  const std::string mflags = megatron_flags_line(p, s.model);
  return {{"plan", shell_quote(plan_file)},       {"out", shell_quote(files.out)},
          {"log", shell_quote(files.log)},        {"run_dir", shell_quote(run_dir.string())},
          {"id", id},                             {"gpus", std::to_string(p.gpus)},
          {"nodes", std::to_string((p.gpus + node - 1) / node)},
          {"gpus_per_node", std::to_string(node)}, {"megatron_flags", mflags},
          {"flags", mflags},                      {"megatron_model_flags", megatron_model_flags(s.model, false)}};
}

TuneRun run_one(const TuneSetup& s, const RankedPlan& rp, int index) {
  char name[32];
  std::snprintf(name, sizeof name, "run-%03d", index);
  const fs::path rd = fs::path(s.run_dir) / name;
  fs::create_directories(rd);
  const RunFiles files{(rd / "measured.json").string(), (rd / "log.txt").string()};
  fs::remove(files.out);
  fs::remove(files.log);
  const std::string plan_file = (rd / "plan.json").string();
  write_plan_file(plan_file, rp.plan);
  TuneRun run;
  run.command = expand_launch_template(s.launch_template, launch_values(s, rp.plan, rd, files, plan_file, name));
  run.log = files.log;
  if (s.say) s.say("  run " + std::to_string(index) + ": " + plan_label(rp.plan) + "  predicted " +
                   seconds_text(rp.predicted_seconds) + " ...");
  const ProcessResult pr = run_shell(run.command, files.log, s.run_timeout);
  run.measured = read_run_measurement(pr, files, rp.plan, std::string("tune ") + name, s.skip_iterations);
  if (!s.say) return run;
  if (run.measured.status == MeasurementStatus::OutOfMemory)
    s.say("         out of memory: the plan does not fit (" + run.measured.failure + ")");
  else if (run.measured.step_seconds)
    s.say("         " + prediction_against_measurement(rp.predicted_seconds, *run.measured.step_seconds));
  return run;
}

// A template that passes the plan only as Megatron flags (no {plan}) runs what those flags say.
bool launches_megatron_flags(const std::string& t) {
  return t.find("{plan}") == std::string::npos &&
         (t.find("{megatron_flags}") != std::string::npos || t.find("{flags}") != std::string::npos);
}

// The top-level recipe keys whose values differ between two plans ("moe, recompute_layers").
std::string differing_keys(const Plan& a, const Plan& b) {
  const nlohmann::json ja = plan_to_json(a), jb = plan_to_json(b);
  std::string keys;
  for (const auto& [k, v] : ja.items())
    if (!jb.contains(k) || jb.at(k) != v) keys += (keys.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : jb.items())
    if (!ja.contains(k)) keys += (keys.empty() ? "" : ", ") + k;
  return keys;
}

// The ranked plans as their launches run them: under a Megatron launch template each plan is what its emitted flags
// read back as (fields Megatron has no flag for keep the plan's: hardware, NVLink domain, implementation, model name,
// and its run settings left to the implementation resolve as the flags' absence means). Two plans whose launches are
// identical are one run: the later is dropped with a line saying which fields told them apart.
std::vector<RankedPlan> as_launched(const TuneSetup& s, const Calibration& cal, const std::vector<Candidate>& top) {
  std::vector<RankedPlan> out;
  const bool megatron = launches_megatron_flags(s.launch_template);
  for (const Candidate& c : top) {
    RankedPlan rp{c.plan, plan_key(c.plan), c.estimate.time.step_seconds, c.estimate.memory.peak_bytes};
    if (megatron) {
      Plan p = finish_megatron_plan(parse_megatron_args(megatron_flags_line(c.plan, s.model)), s.model, c.plan.gpus);
      p.model = c.plan.model, p.hardware = c.plan.hardware, p.gpus_per_node = c.plan.gpus_per_node;
      p.implementation = c.plan.implementation;
      resolve_run_defaults(p, s.model, cal);
      const Estimate e = estimate(s.model, p, s.hardware, cal);
      rp = {p, plan_key(p), e.time.step_seconds, e.memory.peak_bytes};
    }
    const auto same = std::find_if(out.begin(), out.end(), [&](const RankedPlan& o) { return o.key == rp.key; });
    if (same == out.end()) {
      out.push_back(std::move(rp));
    } else if (s.say) {
      s.say("  " + plan_label(c.plan) + " launches as " + plan_label(same->plan) + " (they differ only in " +
            differing_keys(c.plan, same->plan) + ", which the launch does not carry): running one");
    }
  }
  return out;
}

}  // namespace

std::string megatron_flags_line(const Plan& p, const ModelSpec& m) {
  const std::string emitted = megatron_flags(p, m);
  std::string out;
  size_t start = 0;
  while (start < emitted.size()) {
    size_t end = emitted.find('\n', start);
    if (end == std::string::npos) end = emitted.size();
    const std::string line = emitted.substr(start, end - start);
    if (!line.empty() && line[0] == '#') break;  // emit's comment lines name what has no flag
    out += (out.empty() ? "" : " ") + line;
    start = end + 1;
  }
  return out;
}

std::string prediction_against_measurement(double predicted, double measured) {
  std::string text = "predicted " + seconds_text(predicted) + ", measured " + seconds_text(measured);
  const double rel = predicted / measured - 1;
  if (!std::isfinite(rel)) return text;
  char buf[64];
  std::snprintf(buf, sizeof buf, ": the prediction %.1f%% %s", 100 * std::abs(rel), rel >= 0 ? "high" : "low");
  return text + buf;
}

TuneHooks make_tune_hooks(const TuneSetup& s) {
  // Measured runs resolved once (model, hardware), by id: every round predicts every run again.
  auto cases = std::make_shared<std::map<std::string, MeasuredCase>>();
  auto case_of = [&s, cases](const Measurement& m) -> const MeasuredCase& {
    auto it = cases->find(m.id);
    if (it == cases->end()) it = cases->emplace(m.id, resolve_measurements({m}, s.data_dir).at(0)).first;
    return it->second;
  };
  TuneHooks h;
  h.rank = [&s](const Calibration& cal, int count, const std::set<std::string>& skip) {
    SearchOptions opt = s.search;
    opt.top_k = count;
    opt.admit = [&](const Plan& p) { return (!s.runnable || s.runnable(p)) && (skip.empty() || !skip.count(plan_key(p))); };
    const SearchResult r = search_plans(s.model, s.base, s.space, s.hardware, cal, opt);
    if (r.top.empty()) throw UserError(explain_infeasible(r, s.hardware, opt));
    return as_launched(s, cal, r.top);
  };
  h.run = [&s](const RankedPlan& rp, int index) { return run_one(s, rp, index); };
  h.predict = [case_of](const Measurement& m, const Calibration& cal) {
    return predict(case_of(m), Quantity::StepSeconds, cal);
  };
  h.refit = [&s, case_of](const std::vector<Measurement>& measured, const Calibration& current) {
    std::vector<MeasuredCase> cs;
    for (const Measurement& m : measured) cs.push_back(case_of(m));
    return refit_for_tune(std::move(cs), current, s.start, s.refit);
  };
  return h;
}

}  // namespace lcplan
