#include "calibrate/measurement.h"

#include <array>
#include <cmath>
#include <filesystem>

#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/plan_inputs.h"

namespace lcplan {

namespace {

std::optional<double> positive(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return std::nullopt;
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
    throw UserError(where + ": \"" + key + "\" must be a positive number");
  return v.get<double>();
}

double nonneg_value(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw UserError(what + " must be a non-negative number");
  return v.get<double>();
}

std::optional<double> nonneg(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return std::nullopt;
  return nonneg_value(j.at(key), where + ": \"" + key + "\"");
}

int count_value(const nlohmann::json& v, const std::string& what, int lo, int hi) {
  if (!v.is_number_integer() || v.get<long long>() < lo || v.get<long long>() > hi)
    throw UserError(what + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return int(v.get<long long>());
}

std::string text(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return "";
  if (!j.at(key).is_string()) throw UserError(where + ": \"" + key + "\" must be a string");
  return j.at(key).get<std::string>();
}

void only_keys(const nlohmann::json& j, const char* const* first, const char* const* last, const std::string& where) {
  if (!j.is_object()) throw UserError(where + " must be a JSON object");
  for (const auto& [k, _] : j.items()) {
    bool ok = false;
    std::string valid;
    for (const char* const* a = first; a != last; ++a) {
      ok = ok || k == *a;
      valid += std::string(valid.empty() ? "" : ", ") + *a;
    }
    if (!ok) throw UserError(where + " has unknown field \"" + k + "\" (valid: " + valid + ")");
  }
}

void only_keys(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& where) {
  only_keys(j, keys.begin(), keys.end(), where);
}

constexpr std::array<const char*, kMemoryCategoryCount> kCategoryNames = [] {
  std::array<const char*, kMemoryCategoryCount> a{};
  for (int i = 0; i < kMemoryCategoryCount; ++i) a[i] = kMemoryCategories[i].name;
  return a;
}();

}  // namespace

MemoryBreakdown breakdown_from_json(const nlohmann::json& j, const std::string& where) {
  only_keys(j, kCategoryNames.data(), kCategoryNames.data() + kCategoryNames.size(), where);
  MemoryBreakdown b;
  for (const MemoryCategoryInfo& c : kMemoryCategories)
    if (j.contains(c.name)) b.*c.member = nonneg_value(j.at(c.name), where + ": \"" + c.name + "\"");
  return b;
}

Phase phase_from_string(const std::string& s, const std::string& where) {
  for (Phase p : {Phase::Forward, Phase::Loss, Phase::Backward, Phase::Optimizer})
    if (s == to_string(p)) return p;
  throw UserError(where + " must be \"forward\", \"loss\", \"backward\" or \"optimizer\", got \"" + s + "\"");
}

namespace {

Phase phase_value(const nlohmann::json& v, const std::string& where) {
  if (!v.is_string()) throw UserError(where + " must be a string");
  return phase_from_string(v.get<std::string>(), where);
}

void parse_detail(const nlohmann::json& j, const std::string& where, Measurement& m) {
  if (j.contains("breakdown")) m.breakdown = breakdown_from_json(j.at("breakdown"), where + ": \"breakdown\"");
  if (j.contains("peak_phase")) m.peak_phase = phase_value(j.at("peak_phase"), where + ": \"peak_phase\"");
  if (j.contains("peak_rank")) m.peak_rank = count_value(j.at("peak_rank"), where + ": \"peak_rank\"", 0, 1 << 24);
  if (j.contains("phases")) {
    const auto& ph = j.at("phases");
    const std::string w = where + ": \"phases\"";
    only_keys(ph, {"forward", "loss", "backward", "optimizer"}, w);
    for (const auto& [k, v] : ph.items()) {
      const std::string wk = w + "." + k;
      only_keys(v, {"peak_bytes", "breakdown", "category_peaks", "seconds"}, wk);
      MeasuredPhase mp;
      mp.peak_bytes = nonneg(v, "peak_bytes", wk);
      if (v.contains("breakdown")) mp.breakdown = breakdown_from_json(v.at("breakdown"), wk + ".breakdown");
      if (v.contains("category_peaks"))
        mp.category_peaks = breakdown_from_json(v.at("category_peaks"), wk + ".category_peaks");
      mp.seconds = nonneg(v, "seconds", wk);
      m.phases[static_cast<int>(phase_from_string(k, wk))] = mp;
    }
  }
  if (j.contains("ranks")) {
    const auto& rs = j.at("ranks");
    if (!rs.is_array()) throw UserError(where + ": \"ranks\" must be an array");
    for (size_t i = 0; i < rs.size(); ++i) {
      const std::string w = where + ": ranks[" + std::to_string(i) + "]";
      only_keys(rs[i], {"rank", "peak_bytes", "peak_phase", "workspace_high_water_bytes"}, w);
      if (!rs[i].contains("rank")) throw UserError(w + " has no \"rank\"");
      MeasuredRank r;
      r.rank = count_value(rs[i].at("rank"), w + ".rank", 0, 1 << 24);
      r.peak_bytes = nonneg(rs[i], "peak_bytes", w);
      if (rs[i].contains("peak_phase")) r.peak_phase = phase_value(rs[i].at("peak_phase"), w + ".peak_phase");
      r.workspace_high_water_bytes = nonneg(rs[i], "workspace_high_water_bytes", w);
      m.ranks.push_back(r);
    }
  }
  if (j.contains("scale")) {
    const auto& sc = j.at("scale");
    const std::string w = where + ": \"scale\"";
    only_keys(sc, {"factor", "layers_per_kind", "mtp_dropped", "kept_layers", "model"}, w);
    MeasuredScale s;
    if (sc.contains("factor")) s.factor = count_value(sc.at("factor"), w + ".factor", 1, 4096);
    if (sc.contains("layers_per_kind")) s.layers_per_kind = count_value(sc.at("layers_per_kind"), w + ".layers_per_kind", 0, 100000);
    if (sc.contains("mtp_dropped")) s.mtp_dropped = count_value(sc.at("mtp_dropped"), w + ".mtp_dropped", 0, 1000);
    if (sc.contains("kept_layers")) {
      const auto& kl = sc.at("kept_layers");
      if (!kl.is_array()) throw UserError(w + ".kept_layers must be an array of layer indices");
      for (const auto& v : kl) s.kept_layers.push_back(count_value(v, w + ".kept_layers[]", 0, 100000));
    }
    if (sc.contains("model")) {
      if (!sc.at("model").is_object()) throw UserError(w + ".model must be an object");
      s.model = sc.at("model");
    }
    m.scale = s;
  }
  if (j.contains("steps")) m.steps = count_value(j.at("steps"), where + ": \"steps\"", 1, 1 << 24);
  if (j.contains("loss")) {
    const auto& v = j.at("loss");
    if (!v.is_number() || !std::isfinite(v.get<double>())) throw UserError(where + ": \"loss\" must be a finite number");
    m.loss = v.get<double>();
  }
  m.grad_norm = nonneg(j, "grad_norm", where);
  if (j.contains("per_step")) {
    const auto& ps = j.at("per_step");
    if (!ps.is_array()) throw UserError(where + ": \"per_step\" must be an array");
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string w = where + ": per_step[" + std::to_string(i) + "]";
      only_keys(ps[i], {"loss", "grad_norm", "seconds"}, w);
      MeasuredStep st;
      if (ps[i].contains("loss")) {
        const auto& v = ps[i].at("loss");
        if (!v.is_number() || !std::isfinite(v.get<double>())) throw UserError(w + ".loss must be a finite number");
        st.loss = v.get<double>();
      }
      st.grad_norm = nonneg(ps[i], "grad_norm", w);
      st.seconds = nonneg(ps[i], "seconds", w);
      m.per_step.push_back(st);
    }
  }
  m.backend = text(j, "backend", where);
  m.device = text(j, "device", where);
  m.host = text(j, "host", where);
  if (j.contains("executor")) {
    if (!j.at("executor").is_object()) throw UserError(where + ": \"executor\" must be an object");
    m.executor = j.at("executor");
  }
}

}  // namespace

Measurement measurement_from_json(const nlohmann::json& j, const std::string& where_in) {
  std::string where = where_in;
  if (!j.is_object()) throw UserError(where + " must be a JSON object");
  if (j.contains("id") && j.at("id").is_string()) where += " (\"" + j.at("id").get<std::string>() + "\")";
  static const char* kKeys[] = {"id", "source", "plan", "scope", "peak_bytes", "step_seconds", "tflops_per_gpu",
                                "notes", "status", "failure", "peak_reserved_bytes", "not_modelled", "superseded_by",
                                "memory_not_fitted", "peak_stage", "breakdown", "peak_phase", "peak_rank", "phases",
                                "ranks", "scale", "steps", "loss", "grad_norm", "per_step", "backend", "device", "host",
                                "executor"};
  for (const auto& [k, _] : j.items()) {
    bool ok = false;
    for (const char* a : kKeys) ok = ok || k == a;
    if (!ok)
      throw UserError(where + " has unknown field \"" + k +
                      "\" (valid: id, source, plan, scope, peak_bytes, step_seconds, tflops_per_gpu, notes, status, "
                      "failure, peak_reserved_bytes, not_modelled, superseded_by, memory_not_fitted, peak_stage, "
                      "breakdown, peak_phase, peak_rank, phases, ranks, scale, steps, loss, grad_norm, per_step, backend, "
                      "device, host, executor)");
  }
  Measurement m;
  if (j.contains("id")) {
    if (!j.at("id").is_string()) throw UserError(where + ": \"id\" must be a string");
    m.id = j.at("id").get<std::string>();
  }
  for (auto [key, field] : {std::pair<const char*, std::string*>{"notes", &m.notes}, {"not_modelled", &m.not_modelled},
                             {"superseded_by", &m.superseded_by},
                             {"memory_not_fitted", &m.memory_not_fitted}}) {
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
  // A run that did not fit is a result in itself: it needs no measured value.
  if (m.status == MeasurementStatus::Ok && !m.peak_bytes && !m.step_seconds && !m.tflops_per_gpu)
    throw UserError(where + " has no measured value (give peak_bytes, step_seconds or tflops_per_gpu)");
  if (!m.memory_not_fitted.empty() && !m.peak_bytes)
    throw UserError(where + ": \"memory_not_fitted\" says why peak_bytes is checked and not fitted; this record has no "
                            "peak_bytes");
  if (m.scope == MeasurementScope::MoeLayer && (m.peak_stage || m.tflops_per_gpu || !m.step_seconds || m.status != MeasurementStatus::Ok))
    throw UserError(where + ": a \"moe_layer\" measurement takes step_seconds and, optionally, peak_bytes");
  parse_detail(j, where, m);
  if (m.id.empty()) m.id = where_in;
  return m;
}

nlohmann::json measurement_to_json(const Measurement& m) {
  nlohmann::json j;
  j["id"] = m.id;
  if (!m.source.empty()) j["source"] = m.source;
  j["plan"] = plan_to_json(m.plan);
  j["scope"] = m.scope == MeasurementScope::Step ? "step" : "moe_layer";
  if (m.peak_bytes) j["peak_bytes"] = *m.peak_bytes;
  if (m.step_seconds) j["step_seconds"] = *m.step_seconds;
  if (m.tflops_per_gpu) j["tflops_per_gpu"] = *m.tflops_per_gpu;
  if (m.peak_stage) j["peak_stage"] = *m.peak_stage;
  if (m.status == MeasurementStatus::OutOfMemory) j["status"] = "out_of_memory";
  if (!m.failure.empty()) j["failure"] = m.failure;
  if (m.peak_reserved_bytes) j["peak_reserved_bytes"] = *m.peak_reserved_bytes;
  if (!m.not_modelled.empty()) j["not_modelled"] = m.not_modelled;
  if (!m.superseded_by.empty()) j["superseded_by"] = m.superseded_by;
  if (!m.memory_not_fitted.empty()) j["memory_not_fitted"] = m.memory_not_fitted;
  if (m.breakdown) j["breakdown"] = breakdown_to_json(*m.breakdown);
  if (m.peak_phase) j["peak_phase"] = to_string(*m.peak_phase);
  if (m.peak_rank) j["peak_rank"] = *m.peak_rank;
  nlohmann::json phases = nlohmann::json::object();
  for (int p = 0; p < 4; ++p) {
    if (!m.phases[p]) continue;
    nlohmann::json ph = nlohmann::json::object();
    if (m.phases[p]->peak_bytes) ph["peak_bytes"] = *m.phases[p]->peak_bytes;
    if (m.phases[p]->breakdown) ph["breakdown"] = breakdown_to_json(*m.phases[p]->breakdown);
    if (m.phases[p]->category_peaks) ph["category_peaks"] = breakdown_to_json(*m.phases[p]->category_peaks);
    if (m.phases[p]->seconds) ph["seconds"] = *m.phases[p]->seconds;
    phases[to_string(Phase(p))] = ph;
  }
  if (!phases.empty()) j["phases"] = phases;
  if (!m.ranks.empty()) {
    nlohmann::json rs = nlohmann::json::array();
    for (const MeasuredRank& r : m.ranks) {
      nlohmann::json x = {{"rank", r.rank}};
      if (r.peak_bytes) x["peak_bytes"] = *r.peak_bytes;
      if (r.peak_phase) x["peak_phase"] = to_string(*r.peak_phase);
      if (r.workspace_high_water_bytes) x["workspace_high_water_bytes"] = *r.workspace_high_water_bytes;
      rs.push_back(x);
    }
    j["ranks"] = rs;
  }
  if (m.scale) {
    nlohmann::json s = {{"factor", m.scale->factor}, {"layers_per_kind", m.scale->layers_per_kind},
                        {"mtp_dropped", m.scale->mtp_dropped}, {"kept_layers", m.scale->kept_layers}};
    if (!m.scale->model.is_null()) s["model"] = m.scale->model;
    j["scale"] = s;
  }
  if (m.steps) j["steps"] = *m.steps;
  if (m.loss) j["loss"] = *m.loss;
  if (m.grad_norm) j["grad_norm"] = *m.grad_norm;
  if (!m.per_step.empty()) {
    nlohmann::json ps = nlohmann::json::array();
    for (const MeasuredStep& s : m.per_step) {
      nlohmann::json x = nlohmann::json::object();
      if (s.loss) x["loss"] = *s.loss;
      if (s.grad_norm) x["grad_norm"] = *s.grad_norm;
      if (s.seconds) x["seconds"] = *s.seconds;
      ps.push_back(x);
    }
    j["per_step"] = ps;
  }
  if (!m.backend.empty()) j["backend"] = m.backend;
  if (!m.device.empty()) j["device"] = m.device;
  if (!m.host.empty()) j["host"] = m.host;
  if (!m.executor.is_null()) j["executor"] = m.executor;
  if (!m.notes.empty()) j["notes"] = m.notes;
  return j;
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
  std::vector<Measurement> ms = measurements_from_json(read_json_file(path, "measurements file"), path);
  // A plan's model or hardware file is named relative to the measurements file, as in a plan file.
  for (Measurement& m : ms) resolve_plan_paths(m.plan, std::filesystem::path(path).parent_path().string());
  return ms;
}

std::string scaled_record_error(const Measurement& m) {
  if (!m.scale || (m.scale->factor == 1 && m.scale->layers_per_kind == 0 && m.scale->mtp_dropped == 0)) return "";
  return "measurement \"" + m.id + "\" ran a model scaled down from its plan's (lcplan-exec --scale " +
         std::to_string(m.scale->factor) +
         (m.scale->layers_per_kind > 0 ? ", --layers " + std::to_string(m.scale->layers_per_kind) : "") +
         "), so it cannot stand for " + m.plan.model + " here; compare it with the plan it scaled (lcplan validate "
         "--measured RECORD --plan PLAN applies the scale) or measure the plan unscaled";
}

namespace {

// A record that ran something other than its plan says so: lcplan-exec's `scale` (a smaller model than the plan's),
// or its CPU backend against a GPU hardware profile. Such a record is compared with nothing here ("" when it matches).
std::string record_plan_mismatch(const Measurement& m, const Hardware& hw) {
  if (std::string e = scaled_record_error(m); !e.empty()) return e;
  if (m.backend == "cpu" && hw.name.rfind("cpu", 0) != 0)
    return "measurement \"" + m.id + "\" ran on lcplan-exec's CPU backend but its plan names hardware " + hw.name +
           "; give the plan the CPU's hardware profile (e.g. cpu-amd-epyc-2c) or measure on the GPU";
  return "";
}

}  // namespace

std::vector<MeasuredCase> resolve_measurements(const std::vector<Measurement>& ms, const std::string& data_dir,
                                               std::vector<Measurement>* impossible) {
  std::vector<MeasuredCase> out;
  out.reserve(ms.size());
  for (const Measurement& m : ms) {
    if (!m.not_modelled.empty()) continue;
    InputChoices choices;
    choices.with_calibration = false;  // predict() resolves the calibration for each run
    Measurement resolved = m;           // the run's settings its plan left unset, at its implementation's defaults
    PlanInputs in = load_plan_inputs(resolved.plan, data_dir, choices);
    if (const std::string e = record_plan_mismatch(m, in.hardware); !e.empty()) throw UserError(e);
    try {
      check_plan_inputs(in, resolved.plan);
    } catch (const UserError& e) {
      if (!impossible) throw UserError("measurement \"" + m.id + "\": " + e.what());
      impossible->push_back(m);
      impossible->back().not_modelled = std::string("impossible configuration: ") + e.what();
      continue;
    }
    out.push_back({std::move(resolved), std::move(in.model), std::move(in.hardware)});
  }
  return out;
}

}  // namespace lcplan
