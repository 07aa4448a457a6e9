#include "tune/tune_log.h"

#include <cmath>
#include <limits>

#include "common/user_error.h"

namespace lcplan {

namespace {

nlohmann::json ranked_json(const RankedPlan& r) {
  return {{"plan", plan_to_json(r.plan)},
          {"predicted_step_seconds", r.predicted_seconds},
          {"predicted_peak_bytes", r.predicted_peak_bytes}};
}

// A number that may be NaN in memory (no run measured yet) is null in the file.
nlohmann::json number_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw UserError(where + " has no \"" + key + "\"");
  return j.at(key);
}

double number(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) throw UserError(where + ": \"" + key + "\" must be a number");
  return v.get<double>();
}

int integer(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_number_integer()) throw UserError(where + ": \"" + key + "\" must be a whole number");
  return v.get<int>();
}

RankedPlan ranked_from(const nlohmann::json& j, const std::string& where) {
  RankedPlan r;
  try {
    r.plan = plan_from_json(field(j, "plan", where));
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  r.key = plan_key(r.plan);
  r.predicted_seconds = number(j, "predicted_step_seconds", where);
  r.predicted_peak_bytes = number(j, "predicted_peak_bytes", where);
  return r;
}

// The first key whose values differ between two JSON objects (recursively), as a dotted path.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& path) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k)) return path + k;
      if (std::string d = first_difference(v, b.at(k), path + k + "."); !d.empty()) return d;
    }
    for (const auto& [k, _] : b.items())
      if (!a.contains(k)) return path + k;
    return "";
  }
  return a == b ? "" : (path.empty() ? "request" : path.substr(0, path.size() - 1));
}

}  // namespace

nlohmann::json tune_log_json(const nlohmann::json& request, const TuneState& s, const std::optional<TuneOutcome>& outcome) {
  nlohmann::json runs = nlohmann::json::array(), rounds = nlohmann::json::array();
  for (const TuneRun& r : s.runs) {
    nlohmann::json j = ranked_json(r.ranked);
    j["index"] = r.index;
    j["round"] = r.round;
    j["command"] = r.command;
    j["log"] = r.log;
    j["measurement"] = measurement_to_json(r.measured);
    runs.push_back(j);
  }
  for (const TuneRound& r : s.rounds) {
    nlohmann::json coefs = nlohmann::json::array(), ranking = nlohmann::json::array();
    for (const FittedCoefficient& c : r.coefficients)
      coefs.push_back({{"key", c.key}, {"scope", c.scope}, {"prior", c.prior}, {"value", c.value}, {"identified", c.identified}});
    for (const RankedPlan& p : r.ranking) ranking.push_back(ranked_json(p));
    rounds.push_back({{"round", r.round},
                      {"ran", r.ran},
                      {"error_before", number_or_null(r.error_before)},
                      {"error_after", number_or_null(r.error_after)},
                      {"coefficients", coefs},
                      {"ranking", ranking},
                      {"chosen_run", r.chosen_run},
                      {"stable", r.stable}});
  }
  nlohmann::json j = {{"lcplan_tune_log", 1}, {"request", request},      {"calibration", calibration_to_json(s.calibration)},
                      {"runs", runs},         {"rounds", rounds}};
  if (outcome) {
    j["stop"] = to_string(outcome->stop);
    j["chosen_run"] = outcome->chosen_run;
  }
  return j;
}

TuneState tune_state_from_log(const nlohmann::json& log, const nlohmann::json& request, const std::string& file) {
  const std::string where = "tune log " + file;
  if (!log.is_object() || !log.contains("lcplan_tune_log"))
    throw UserError(file + " is not a tune log (no \"lcplan_tune_log\" field); give another --log");
  if (log.at("lcplan_tune_log") != 1)
    throw UserError(where + " has version " + log.at("lcplan_tune_log").dump() + " (this lcplan reads version 1)");
  if (const std::string d = first_difference(field(log, "request", where), request, ""); !d.empty())
    throw UserError(where + " was written for another tune (its \"" + d +
                    "\" differs from this one's); give the same flags to resume it, or another --log to start afresh");
  TuneState s;
  try {
    const nlohmann::json& c = field(log, "calibration", where);
    s.calibration = calibration_from_json(c, c.value("name", "tuned"));
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  const nlohmann::json& runs = field(log, "runs", where);
  const nlohmann::json& rounds = field(log, "rounds", where);
  if (!runs.is_array() || !rounds.is_array()) throw UserError(where + ": \"runs\" and \"rounds\" must be arrays");
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string w = where + " run " + std::to_string(i + 1);
    TuneRun r;
    r.ranked = ranked_from(runs[i], w);
    r.index = integer(runs[i], "index", w);
    r.round = integer(runs[i], "round", w);
    if (r.index != int(i) + 1) throw UserError(w + ": \"index\" is " + std::to_string(r.index) + ", expected " + std::to_string(i + 1));
    if (r.round < 1 || r.round > int(rounds.size()) + 1)
      throw UserError(w + ": \"round\" " + std::to_string(r.round) + " is not a round of this log");
    const nlohmann::json& c = field(runs[i], "command", w);
    const nlohmann::json& l = field(runs[i], "log", w);
    if (!c.is_string() || !l.is_string()) throw UserError(w + ": \"command\" and \"log\" must be strings");
    r.command = c.get<std::string>();
    r.log = l.get<std::string>();
    r.measured = measurement_from_json(field(runs[i], "measurement", w), w + " measurement");
    s.runs.push_back(std::move(r));
  }
  for (size_t i = 0; i < rounds.size(); ++i) {
    const std::string w = where + " round " + std::to_string(i + 1);
    const nlohmann::json& j = rounds[i];
    TuneRound r;
    r.round = integer(j, "round", w);
    if (r.round != int(i) + 1) throw UserError(w + ": \"round\" is " + std::to_string(r.round));
    for (const auto& x : field(j, "ran", w)) {
      if (!x.is_number_integer() || x.get<int>() < 1 || x.get<int>() > int(s.runs.size()))
        throw UserError(w + ": \"ran\" names a run that is not in the log");
      r.ran.push_back(x.get<int>());
    }
    r.error_before = number(j, "error_before", w);
    r.error_after = number(j, "error_after", w);
    for (const auto& c : field(j, "coefficients", w)) {
      FittedCoefficient fc;
      const nlohmann::json& k = field(c, "key", w);
      const nlohmann::json& sc = field(c, "scope", w);
      const nlohmann::json& id = field(c, "identified", w);
      if (!k.is_string() || !sc.is_string() || !id.is_boolean()) throw UserError(w + ": a coefficient entry is malformed");
      fc.key = k.get<std::string>();
      fc.scope = sc.get<std::string>();
      fc.prior = number(c, "prior", w);
      fc.value = number(c, "value", w);
      fc.identified = id.get<bool>();
      r.coefficients.push_back(fc);
    }
    const nlohmann::json& ranking = field(j, "ranking", w);
    if (!ranking.is_array()) throw UserError(w + ": \"ranking\" must be an array");
    for (const auto& p : ranking) r.ranking.push_back(ranked_from(p, w + " ranking"));
    r.chosen_run = integer(j, "chosen_run", w);
    const nlohmann::json& st = field(j, "stable", w);
    if (!st.is_boolean()) throw UserError(w + ": \"stable\" must be true or false");
    r.stable = st.get<bool>();
    s.rounds.push_back(std::move(r));
  }
  return s;
}

}  // namespace lcplan
