// lcplan diff A.json B.json: two plans side by side, term by term (the plan fields that differ, then every memory
// and time term of the two estimates that differs), or a plan and a measured record (the estimate of the plan
// against what the run measured, per category and phase: calibrate/validate_run.h).
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "calibrate/measurement.h"
#include "calibrate/validate_run.h"
#include "cli/commands.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/plan_inputs.h"

namespace lcplan::cli {

namespace {

struct DiffArgs {
  std::vector<std::string> files;  // A, then B
  std::string a, b, calibration;
  bool json = false;
};

// A measurement file is an array of records or {"measurements": [...]}; a recipe is an object with a model.
bool is_measurement_file(const nlohmann::json& j) { return j.is_array() || (j.is_object() && j.contains("measurements")); }

// Leaves of a JSON value by dotted path ("memory.stages.0.breakdown.params").
void flatten(const nlohmann::json& j, const std::string& path, std::vector<std::pair<std::string, nlohmann::json>>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, path.empty() ? k : path + "." + k, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) flatten(j[i], path + "." + std::to_string(i), out);
  } else {
    out.emplace_back(path, j);
  }
}

// Bytes (memory terms) in GiB, everything else as it is.
std::string shown(const std::string& field, const nlohmann::json& v) {
  if (!v.is_number()) return v.is_string() ? v.get<std::string>() : v.dump();
  const bool bytes = field.rfind("memory.", 0) == 0 && (field.find("breakdown.") != std::string::npos ||
                                                         field.find("bytes") != std::string::npos);
  char buf[64];
  if (bytes) std::snprintf(buf, sizeof buf, "%.2f GiB", v.get<double>() / (1 << 30));
  else std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
  return buf;
}

// Every leaf whose value differs between the two records, with the relative change of numbers.
nlohmann::json differences(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::pair<std::string, nlohmann::json>> fa, fb;
  flatten(a, "", fa);
  flatten(b, "", fb);
  std::map<std::string, std::pair<nlohmann::json, nlohmann::json>> both;
  for (const auto& [k, v] : fa) both[k].first = v;
  for (const auto& [k, v] : fb) both[k].second = v;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [k, ab] : both) {
    const auto& [x, y] = ab;
    if (x == y) continue;
    nlohmann::json r = {{"field", k}, {"a", x}, {"b", y}};
    if (x.is_number() && y.is_number() && x.get<double>() != 0) r["relative"] = y.get<double>() / x.get<double>() - 1;
    rows.push_back(r);
  }
  return rows;
}

nlohmann::json estimate_record(Plan plan, const std::string& calibration) {
  InputChoices c;
  if (!calibration.empty()) c.calibration = calibration;
  const PlanInputs in = load_checked_inputs(plan, data_dir(), c);
  return estimate_to_json(estimate(in.model, plan, in.hardware, in.calibration), plan);
}

std::string diff_table(const nlohmann::json& rows, const std::string& a, const std::string& b) {
  std::string out = "A = " + a + "\nB = " + b + "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-52s %16s %16s %9s\n", "field (only those that differ)", "A", "B", "B/A-1");
  out += line;
  for (const auto& r : rows) {
    const std::string rel = r.contains("relative") ? [&] {
      char x[32];
      std::snprintf(x, sizeof x, "%+.1f%%", 100 * r.at("relative").get<double>());
      return std::string(x);
    }() : "";
    const std::string field = r.at("field");
    std::snprintf(line, sizeof line, "%-52s %16s %16s %9s\n", field.c_str(), shown(field, r.at("a")).c_str(),
                  shown(field, r.at("b")).c_str(), rel.c_str());
    out += line;
  }
  if (rows.empty()) out += "(the two estimates are identical)\n";
  return out;
}

int run_diff(const DiffArgs& a) {
  const nlohmann::json ja = read_json_file(a.a, "plan file"), jb = read_json_file(a.b, "plan or measurement file");
  if (is_measurement_file(ja)) throw UserError(a.a + " is a measurement file; give the plan first (lcplan diff PLAN MEASURED)");
  const Plan plan = load_plan_file(a.a);
  if (is_measurement_file(jb)) {
    ValidateRunArgs v;
    v.plan = a.a;
    v.measured = a.b;
    v.calibration = a.calibration;
    v.json = a.json;
    std::fputs(validate_run(v, data_dir()).c_str(), stdout);
    return 0;
  }
  const nlohmann::json rows = differences(estimate_record(plan, a.calibration), estimate_record(load_plan_file(a.b), a.calibration));
  std::fputs(a.json ? (rows.dump(2) + "\n").c_str() : diff_table(rows, a.a, a.b).c_str(), stdout);
  return 0;
}

}  // namespace

void register_diff(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<DiffArgs>();
  auto* cmd = app.add_subcommand("diff", "two plans term by term, or a plan against a measured record");
  cmd->add_option("files", a->files,
                  "A.json B.json: two recipes, or a recipe and a measurement file of it (lcplan-exec --out, lcplan ingest)")
      ->required();
  cmd->add_option("--calibration", a->calibration, "calibration profile (default: default)");
  cmd->add_flag("--json", a->json, "print the differences as JSON");
  cmd->callback([a, &exit_code]() {
    if (a->files.size() != 2)
      throw UserError("diff takes two files, not " + std::to_string(a->files.size()) + " (lcplan diff A.json B.json)");
    a->a = a->files[0];
    a->b = a->files[1];
    exit_code = run_diff(*a);
  });
}

}  // namespace lcplan::cli
