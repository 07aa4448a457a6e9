#include "calibrate/measurement.h"

#include <cmath>

#include "estimator/plan_rules.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "models/zoo.h"

namespace lcplan {

namespace {

std::optional<double> positive(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return std::nullopt;
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
    throw UserError(where + ": \"" + key + "\" must be a positive number");
  return v.get<double>();
}

}  // namespace

Measurement measurement_from_json(const nlohmann::json& j, const std::string& where_in) {
  std::string where = where_in;
  if (!j.is_object()) throw UserError(where + " must be a JSON object");
  if (j.contains("id") && j.at("id").is_string()) where += " (\"" + j.at("id").get<std::string>() + "\")";
  static const char* kKeys[] = {"id",           "source",         "plan",       "scope",        "peak_bytes",
                                "step_seconds", "tflops_per_gpu", "notes",      "status",       "failure",
                                "peak_reserved_bytes", "not_modelled", "superseded_by", "peak_stage"};
  for (const auto& [k, _] : j.items()) {
    bool ok = false;
    for (const char* a : kKeys) ok = ok || k == a;
    if (!ok)
      throw UserError(where + " has unknown field \"" + k +
                      "\" (valid: id, source, plan, scope, peak_bytes, step_seconds, tflops_per_gpu, notes, status, "
                      "failure, peak_reserved_bytes, not_modelled, superseded_by, peak_stage)");
  }
  Measurement m;
  if (j.contains("id")) {
    if (!j.at("id").is_string()) throw UserError(where + ": \"id\" must be a string");
    m.id = j.at("id").get<std::string>();
  }
  for (auto [key, field] : {std::pair<const char*, std::string*>{"notes", &m.notes}, {"not_modelled", &m.not_modelled},
                             {"superseded_by", &m.superseded_by}}) {
    if (!j.contains(key)) continue;
    if (!j.at(key).is_string()) throw UserError(where + ": \"" + key + "\" must be a string");
    *field = j.at(key).get<std::string>();
  }
  if (j.contains("source")) m.source = j.at("source").is_string() ? j.at("source").get<std::string>() : j.at("source").dump();
  if (!j.contains("plan")) throw UserError(where + ": field \"plan\" is missing (give the recipe.json of the measured run)");
  try {
    m.plan = plan_from_json(j.at("plan"));
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  if (j.contains("scope")) {
    const auto& s = j.at("scope");
    if (s == "step") m.scope = MeasurementScope::Step;
    else if (s == "moe_layer") m.scope = MeasurementScope::MoeLayer;
    else throw UserError(where + ": \"scope\" must be \"step\" or \"moe_layer\", got " + s.dump());
  }
  m.peak_bytes = positive(j, "peak_bytes", where);
  m.step_seconds = positive(j, "step_seconds", where);
  if (j.contains("peak_stage")) {
    const auto& s = j.at("peak_stage");
    if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() >= m.plan.parallel.pp)
      throw UserError(where + ": \"peak_stage\" must be a pipeline stage from 0 to pp - 1 = " +
                      std::to_string(m.plan.parallel.pp - 1));
    if (!j.contains("peak_bytes")) throw UserError(where + ": \"peak_stage\" needs \"peak_bytes\"");
    m.peak_stage = int(s.get<int64_t>());
  }
  m.tflops_per_gpu = positive(j, "tflops_per_gpu", where);
  m.peak_reserved_bytes = positive(j, "peak_reserved_bytes", where);
  if (j.contains("status")) {
    const auto& s = j.at("status");
    if (s == "ok") m.status = MeasurementStatus::Ok;
    else if (s == "out_of_memory") m.status = MeasurementStatus::OutOfMemory;
    else throw UserError(where + ": \"status\" must be \"ok\" or \"out_of_memory\", got " + s.dump());
  }
  if (j.contains("failure") && !j.at("failure").is_string()) throw UserError(where + ": \"failure\" must be a string");
  if (j.contains("failure")) m.failure = j.at("failure").get<std::string>();
  if (j.contains("notes") && j.at("notes").is_string()) m.notes = j.at("notes").get<std::string>();  // free text, any type kept as before
  // A run that did not fit is a result in itself: it needs no measured value.
  if (m.status == MeasurementStatus::Ok && !m.peak_bytes && !m.step_seconds && !m.tflops_per_gpu)
    throw UserError(where + " has no measured value (give peak_bytes, step_seconds or tflops_per_gpu)");
  if (m.scope == MeasurementScope::MoeLayer && (m.peak_bytes || m.tflops_per_gpu || !m.step_seconds || m.status != MeasurementStatus::Ok))
    throw UserError(where + ": a \"moe_layer\" measurement takes step_seconds only");
  if (m.id.empty()) m.id = where_in;
  return m;
}

std::vector<Measurement> measurements_from_json(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json* list = &j;
  if (j.is_object()) {
    for (const auto& [k, _] : j.items())
      if (k != "measurements" && k != "description")
        throw UserError(where + " has unknown top-level field \"" + k + "\" (valid: measurements, description)");
    if (!j.contains("measurements")) throw UserError(where + " has no \"measurements\" array");
    list = &j.at("measurements");
  }
  if (!list->is_array()) throw UserError(where + " must be a JSON array of measurements or {\"measurements\": [...]}");
  std::vector<Measurement> out;
  for (size_t i = 0; i < list->size(); ++i)
    out.push_back(measurement_from_json((*list)[i], where + " measurement " + std::to_string(i + 1)));
  if (out.empty()) throw UserError(where + " holds no measurements");
  return out;
}

std::vector<Measurement> load_measurements(const std::string& path) {
  return measurements_from_json(read_json_file(path, "measurements file"), path);
}

std::vector<MeasuredCase> resolve_measurements(const std::vector<Measurement>& ms, const std::string& data_dir,
                                               std::vector<Measurement>* impossible) {
  std::vector<MeasuredCase> out;
  out.reserve(ms.size());
  for (const Measurement& m : ms) {
    if (!m.not_modelled.empty()) continue;
    MeasuredCase c{m, model_for_plan(load_model(m.plan.model, data_dir), m.plan), load_hardware(m.plan.hardware, data_dir)};
    try {
      require_valid_plan(c.model, c.meas.plan);
      if (const std::string e = precision_support_error(c.hw, c.meas.plan.precision); !e.empty()) throw UserError(e);
    } catch (const UserError& e) {
      if (!impossible) throw UserError("measurement \"" + m.id + "\": " + e.what());
      impossible->push_back(m);
      impossible->back().not_modelled = std::string("impossible configuration: ") + e.what();
      continue;
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace lcplan
