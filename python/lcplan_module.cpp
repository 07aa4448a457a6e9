// `import lcplan`: the estimator, the search, the zoo and validation from Python. Records cross as dicts holding
// exactly what `lcplan estimate --json` / `lcplan search --json` / `lcplan models --json` print; a mistake in the
// input is a ValueError carrying lcplan's one sentence.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate/calibrate_fit.h"
#include "calibrate/measurement.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/progress.h"
#include "common/user_error.h"
#include "estimator/calibration.h"
#include "estimator/estimate.h"
#include "estimator/hardware.h"
#include "estimator/plan_inputs.h"
#include "models/model_table.h"
#include "models/zoo.h"
#include "search/emit.h"
#include "search/reduce.h"
#include "search/search.h"
#include "search/space_constraints.h"

namespace py = pybind11;
using nlohmann::json;

namespace lcplan {
namespace {

// ---- JSON <-> Python ---------------------------------------------------------------------------------------------

py::object to_python(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get<std::string>());
    case json::value_t::array: {
      py::list l;
      for (const json& v : j) l.append(to_python(v));
      return l;
    }
    case json::value_t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[py::str(k)] = to_python(v);
      return d;
    }
    default: return py::none();  // binary and discarded values never occur in lcplan's records
  }
}

// `where` names the argument in errors ("plan", "measurements").
json from_python(py::handle h, const std::string& where, int depth = 0) {
  if (depth > 64) throw UserError(where + " is nested more than 64 levels deep (a record is a few levels)");
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();  // before int: bool is an int in Python
  if (py::isinstance<py::int_>(h)) {
    try {
      return h.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw UserError(where + " holds the integer " + py::str(h).cast<std::string>() + ", too large for a record (valid: within 64 bits)");
    }
  }
  if (py::isinstance<py::float_>(h)) {
    const double v = h.cast<double>();
    if (!std::isfinite(v)) throw UserError(where + " holds " + py::str(h).cast<std::string>() + " (valid: a finite number)");
    return v;
  }
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::dict>(h)) {
    json o = json::object();
    for (auto [k, v] : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(k))
        throw UserError(where + " has a key " + py::repr(k).cast<std::string>() + " that is not a string (JSON keys are strings)");
      const std::string key = k.cast<std::string>();
      o[key] = from_python(v, where + "[\"" + key + "\"]", depth + 1);
    }
    return o;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    json a = json::array();
    size_t i = 0;
    for (py::handle v : h) a.push_back(from_python(v, where + "[" + std::to_string(i++) + "]", depth + 1));
    return a;
  }
  throw UserError(where + " holds a " + py::type::of(h).attr("__name__").cast<std::string>() +
                  ", which a JSON record cannot hold (valid: dict, list, str, int, float, bool, None)");
}

std::string type_name(py::handle h) { return py::type::of(h).attr("__name__").cast<std::string>(); }

// ---- estimate ----------------------------------------------------------------------------------------------------

// A record given as a dict, or as the path of a JSON file.
json record_arg(py::handle h, const std::string& what) {
  if (py::isinstance<py::str>(h)) return read_json_file(h.cast<std::string>(), what + " file");
  if (!py::isinstance<py::dict>(h))
    throw UserError(what + " must be a dict (the " + what + " record) or the path of a JSON file, not a " + type_name(h));
  return from_python(h, what);
}

// A hardware or calibration argument: a profile name or JSON path (loaded by name) or a dict (given inline).
void choose_hardware(py::handle h, Plan& plan, InputChoices& c) {
  if (h.is_none()) return;
  if (py::isinstance<py::str>(h)) {
    plan.hardware = h.cast<std::string>();  // as `--hardware` does
  } else if (py::isinstance<py::dict>(h)) {
    const json j = from_python(h, "hardware");
    c.hardware = hardware_from_json(j, j.contains("name") && j.at("name").is_string() ? j.at("name").get<std::string>() : "hardware");
  } else {
    throw UserError("hardware must be a profile name, a JSON path or a dict, not a " + type_name(h));
  }
}

void choose_calibration(py::handle h, InputChoices& c) {
  if (h.is_none()) return;
  if (py::isinstance<py::str>(h)) c.calibration = h.cast<std::string>();
  else if (py::isinstance<py::dict>(h)) c.profile = calibration_from_json(from_python(h, "calibration"), "calibration");
  else throw UserError("calibration must be a profile name, a JSON path or a dict, not a " + type_name(h));
}

py::dict estimate_py(py::handle plan_arg, py::handle hardware_arg, py::handle calibration_arg) {
  Plan plan = plan_from_json(record_arg(plan_arg, "plan"));
  InputChoices c;
  choose_hardware(hardware_arg, plan, c);
  choose_calibration(calibration_arg, c);
  // The same loader and steps as `lcplan estimate`, so that the record is the CLI's bit for bit.
  const PlanInputs in = load_checked_inputs(plan, data_dir(), c);
  return to_python(estimate_to_json(estimate(in.model, plan, in.hardware, in.calibration), plan));
}

// ---- search ------------------------------------------------------------------------------------------------------

int int_of(py::handle h, const std::string& name) {
  if (py::isinstance<py::bool_>(h) || !py::isinstance<py::int_>(h))
    throw UserError(name + " " + py::repr(h).cast<std::string>() + " is not a whole number (valid: an int, or a list of ints)");
  const long long v = h.cast<long long>();
  if (v < 0 || v > 1 << 30) throw UserError(name + " " + std::to_string(v) + " is out of range (valid: 0 to 2^30)");
  return int(v);
}
int positive_int_of(py::handle h, const std::string& name) {
  if (py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h) && h.cast<long long>() < 1)
    throw UserError(name + " " + py::repr(h).cast<std::string>() + " is out of range (valid: 1 or more)");
  const int v = int_of(h, name);
  return v;
}
bool bool_of(py::handle h, const std::string& name) {
  if (!py::isinstance<py::bool_>(h)) throw UserError(name + " " + py::repr(h).cast<std::string>() + " is not True or False");
  return h.cast<bool>();
}
std::string str_of(py::handle h, const std::string& name) {
  if (!py::isinstance<py::str>(h)) throw UserError(name + " " + py::repr(h).cast<std::string>() + " is not a string");
  return h.cast<std::string>();
}
double number_of(py::handle h, const std::string& name) {
  if (py::isinstance<py::bool_>(h) || !(py::isinstance<py::int_>(h) || py::isinstance<py::float_>(h)))
    throw UserError(name + " " + py::repr(h).cast<std::string>() + " is not a number");
  const double v = h.cast<double>();
  if (!std::isfinite(v)) throw UserError(name + " " + py::repr(h).cast<std::string>() + " is not a finite number");
  return v;
}

// A dimension the search may pin (one value) or restrict (a list) as the space request's array
// (search/space_constraints.h), each value checked for its kind in Python's words.
json space_values(py::handle h, const SpaceDimension& d) {
  auto one = [&d](py::handle v) -> json {
    if (d.kind == DimensionKind::Count) return d.least > 0 ? positive_int_of(v, d.key) : int_of(v, d.key);
    if (d.kind == DimensionKind::Switch) return bool_of(v, d.key);
    return str_of(v, d.key);  // a sharding or recompute name
  };
  json out = json::array();
  if (!py::isinstance<py::list>(h) && !py::isinstance<py::tuple>(h)) {
    out.push_back(one(h));
    return out;
  }
  for (py::handle v : h) out.push_back(one(v));
  if (out.empty()) throw UserError(std::string(d.key) + " is an empty list (give a value, or a list of at least one)");
  return out;
}

// search()'s keyword arguments: the fixed fields, the dimensions of the space, the search options.
const std::vector<std::string>& search_arguments() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"model", "gpus", "seq", "hardware", "gpus_per_node", "global_batch", "precision",
                                  "implementation", "calibration", "sequence_parallel", "offload_activations",
                                  "routing_imbalance", "capacity_factor"};
    for (const SpaceDimension& d : space_dimensions()) n.push_back(d.key);
    for (const char* k : {"headroom", "objective", "throughput_floor", "top"}) n.push_back(k);
    return n;
  }();
  return names;
}

py::dict search_py(const py::kwargs& kw) {
  std::map<std::string, py::handle> a;
  for (auto [k, v] : kw) a[k.cast<std::string>()] = v;
  for (const auto& [k, _] : a) {
    const auto& names = search_arguments();
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      std::string valid;
      for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
      throw UserError("search got an unknown argument \"" + k + "\" (valid: " + valid + ")");
    }
  }
  for (const char* need : {"model", "gpus", "seq"})
    if (!a.count(need) || a.at(need).is_none())
      throw UserError(std::string("search needs ") + need + " (e.g. search(model=\"qwen3.5-35b-a3b\", gpus=32, seq=\"128k\"))");

  // The fixed fields: a recipe record, so that plan_from_json checks them as it checks a recipe file.
  json base = {{"model", str_of(a.at("model"), "model")}, {"gpus", positive_int_of(a.at("gpus"), "gpus")}};
  const py::handle seq = a.at("seq");
  if (py::isinstance<py::str>(seq)) base["seq_len"] = parse_size(seq.cast<std::string>(), "seq");
  else base["seq_len"] = positive_int_of(seq, "seq");
  for (const char* k : {"hardware", "precision", "implementation"})
    if (a.count(k)) base[k] = str_of(a.at(k), k);
  for (const char* k : {"gpus_per_node", "global_batch"})
    if (a.count(k)) base[k] = positive_int_of(a.at(k), k);
  if (a.count("sequence_parallel")) base["sequence_parallel"] = bool_of(a.at("sequence_parallel"), "sequence_parallel");
  base["offload"] = json::object();
  if (a.count("offload_activations")) base["offload"]["activations"] = bool_of(a.at("offload_activations"), "offload_activations");
  base["moe"] = json::object();
  for (const char* k : {"routing_imbalance", "capacity_factor"})
    if (a.count(k)) base["moe"][k] = number_of(a.at(k), k);

  // Dimensions: one value pins, a list restricts; the base takes the first value, as the CLI's flags do.
  json request = json::object();
  for (const SpaceDimension& d : space_dimensions())
    if (a.count(d.key)) request[d.key] = space_values(a.at(d.key), d);
  const SpaceConstraints constraints = parse_space_request(request, Naming::Keywords);
  Plan plan = plan_from_json(base);

  InputChoices choices;
  if (a.count("calibration")) choices.calibration = str_of(a.at("calibration"), "calibration");
  choices.search = true;  // unset performance switches at the framework's recommended values, as `lcplan search`
  const PlanInputs in = load_plan_inputs(plan, data_dir(), choices);
  check_plan_inputs(in, plan, /*rules=*/false);  // the search chooses the free dimensions
  const ModelSpec& model = in.model;
  const Hardware& hw = in.hardware;
  const Calibration& cal = in.calibration;
  if (plan.global_batch == 0) plan.global_batch = effective_global_batch(plan);  // the one default (estimator/plan.h)

  SearchOptions opt;
  const double hbm_gib = hw.hbm_bytes / double(1 << 30);
  const double headroom = a.count("headroom") ? number_of(a.at("headroom"), "headroom") : 4.0;
  if (headroom < 0 || headroom >= hbm_gib)
    throw UserError("headroom " + std::to_string(headroom) + " is out of range (valid: GiB from 0 up to below the " +
                    std::to_string(int(hbm_gib)) + " GiB of " + hw.name + ")");
  opt.headroom_bytes = headroom * (1 << 30);
  const std::string objective = a.count("objective") ? str_of(a.at("objective"), "objective") : "throughput";
  if (objective == "memory") opt.objective = Objective::Memory;
  else if (objective != "throughput") throw UserError("objective \"" + objective + "\" is not valid (valid: throughput or memory)");
  if (a.count("throughput_floor")) {
    if (opt.objective != Objective::Memory)
      throw UserError("throughput_floor applies only to objective=\"memory\" (add it or drop the floor)");
    opt.throughput_floor = number_of(a.at("throughput_floor"), "throughput_floor");
  }
  if (a.count("top")) {
    opt.top_k = positive_int_of(a.at("top"), "top");
    if (opt.top_k > 1000) throw UserError("top " + std::to_string(opt.top_k) + " is out of range (valid: 1 to 1000)");
  }
  const PlanSpace space = search_space(model, plan, constraints, Naming::Keywords);
  SearchResult r = [&] {
    TerminalProgress line(stderr, "searching", "plans");  // shown only when stderr is a terminal
    return search_plans(model, plan, space, hw, cal, opt, [&](const SearchProgress& s) {
      line.update({s.done, s.total, 0, s.has_best, s.best_tokens_per_second_per_gpu, s.best_tflops_per_gpu});
    });
  }();
  const ReducedRecipe recipe = reduce_recipe(model, plan, hw, cal, opt, r);
  if (r.top.empty()) throw UserError(explain_infeasible(r, hw, opt));
  return to_python(search_json(r, recipe));
}

// ---- validate ----------------------------------------------------------------------------------------------------

// Predicted against measured for every measured quantity of every run, under each run's calibration profile (or the
// one given): a thin wrapper over calibrate's predict().
py::dict validate_py(py::handle measurements_arg, py::handle calibration_arg) {
  json j;
  if (py::isinstance<py::str>(measurements_arg)) j = read_json_file(measurements_arg.cast<std::string>(), "measurements file");
  else if (py::isinstance<py::list>(measurements_arg) || py::isinstance<py::tuple>(measurements_arg) ||
           py::isinstance<py::dict>(measurements_arg))
    j = from_python(measurements_arg, "measurements");
  else
    throw UserError("measurements must be a list of measurement dicts, {\"measurements\": [...]}, or a JSON path, not a " +
                    type_name(measurements_arg));
  const std::string dir = data_dir();
  const std::vector<MeasuredCase> cases = resolve_measurements(measurements_from_json(j, "measurements"), dir);
  Calibration profile;  // predict() resolves it for each run's hardware and implementation
  if (calibration_arg.is_none()) profile = load_calibration("default", dir);
  else if (py::isinstance<py::str>(calibration_arg)) profile = load_calibration(calibration_arg.cast<std::string>(), dir);
  else if (py::isinstance<py::dict>(calibration_arg)) profile = calibration_from_json(from_python(calibration_arg, "calibration"), "calibration");
  else throw UserError("calibration must be a profile name, a JSON path or a dict, not a " + type_name(calibration_arg));
  json runs = json::array();
  std::map<std::string, std::pair<double, int>> abs_error;  // quantity -> (sum |error|, count)
  for (const MeasuredCase& c : cases) {
    const Calibration& cal = profile;
    json q = json::object();
    const std::pair<Quantity, std::optional<double>> measured[] = {{Quantity::PeakBytes, c.meas.peak_bytes},
                                                                  {Quantity::StepSeconds, c.meas.step_seconds},
                                                                  {Quantity::TflopsPerGpu, c.meas.tflops_per_gpu}};
    for (const auto& [quantity, value] : measured) {
      if (!value) continue;
      const double predicted = predict(c, quantity, cal);
      const double err = predicted / *value - 1;
      q[to_string(quantity)] = {{"measured", *value}, {"predicted", predicted}, {"relative_error", err}};
      auto& [sum, n] = abs_error[to_string(quantity)];
      sum += std::fabs(err);
      ++n;
    }
    runs.push_back({{"id", c.meas.id},
                    {"scope", c.meas.scope == MeasurementScope::Step ? "step" : "moe_layer"},
                    {"calibration", profile.name},
                    {"implementation", c.meas.plan.implementation},
                    {"plan", plan_to_json(c.meas.plan)},
                    {"quantities", q}});
  }
  json mape = json::object();
  for (const auto& [k, v] : abs_error) mape[k] = v.first / v.second;
  return to_python({{"runs", runs}, {"mape", mape}});
}

}  // namespace
}  // namespace lcplan

PYBIND11_MODULE(lcplan, m) {
  m.doc() = "lcplan: memory and step time of long-context MoE training plans (the `lcplan` CLI's records as dicts)";
  // A mistake in the input is a ValueError with lcplan's one sentence; anything else is a bug and stays a RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lcplan::UserError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("estimate", &lcplan::estimate_py, py::arg("plan"), py::arg("hardware") = py::none(),
        py::arg("calibration") = py::none(),
        "Estimate of one plan (a recipe.json dict or path): the record `lcplan estimate --json` prints. hardware and "
        "calibration override the plan's (a profile name, a JSON path, or a dict).");
  m.def("search", &lcplan::search_py,
        "Search plans: search(model=..., gpus=..., seq=..., **constraints). Any plan field pins a dimension (tp=1) or "
        "restricts it (ep=[8, 16]); headroom (GiB), objective, throughput_floor and top as in `lcplan search`. Returns "
        "the record `lcplan search --json` prints.");
  m.def("models", []() { return lcplan::to_python(lcplan::models_json(lcplan::data_dir())); },
        "The model zoo: the records `lcplan models --json` prints.");
  m.def("validate", &lcplan::validate_py, py::arg("measurements"), py::arg("calibration") = py::none(),
        "Predicted against measured for each run of a measurement list (lcplan calibrate's format): per run and "
        "quantity {measured, predicted, relative_error}, and the mean absolute relative error per quantity.");
  m.attr("__version__") = "0.1";
}
