#include "search/space_constraints.h"

#include <climits>

#include "common/user_error.h"
#include "estimator/frameworks.h"
#include "estimator/plan_rules.h"

namespace lcplan {

const std::vector<SpaceDimension>& space_dimensions() {
  static const std::vector<SpaceDimension> d = {
      {"tp", "--tp", DimensionKind::Count, 1, &SpaceConstraints::tp},
      {"pp", "--pp", DimensionKind::Count, 1, &SpaceConstraints::pp},
      {"vpp", "--vpp", DimensionKind::Count, 1, &SpaceConstraints::vpp},
      {"cp", "--cp", DimensionKind::Count, 1, &SpaceConstraints::cp},
      {"ep", "--ep", DimensionKind::Count, 1, &SpaceConstraints::ep},
      {"etp", "--etp", DimensionKind::Count, 1, &SpaceConstraints::etp},
      {"micro_batch", "--micro-batch", DimensionKind::Count, 1, &SpaceConstraints::micro_batch},
      {"ep_chunks", "--ep-chunks", DimensionKind::Count, 1, &SpaceConstraints::ep_chunks},
      // 0 = all layers of a virtual stage
      {"recompute_layers", "--recompute-layers", DimensionKind::Count, 0, &SpaceConstraints::recompute_layers},
      {"optimizer_sharding", "--optimizer-sharding", DimensionKind::Sharding},
      {"recompute", "--recompute", DimensionKind::Recompute},
      {"linear_ce", "--linear-ce", DimensionKind::Switch, 0, nullptr, &SpaceConstraints::linear_ce},
      {"offload_optimizer", "--offload-optimizer", DimensionKind::Switch, 0, nullptr, &SpaceConstraints::offload_optimizer},
  };
  return d;
}

namespace {

// One value or an array of them, each a value of its own; a name may hold a comma list.
std::vector<nlohmann::json> items(const nlohmann::json& given, const SpaceDimension& d, const std::string& name) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& v : given.is_array() ? given : nlohmann::json::array({given})) {
    const bool named = d.kind == DimensionKind::Sharding || d.kind == DimensionKind::Recompute;
    if (!named || !v.is_string()) {
      out.push_back(v);
      continue;
    }
    const std::string text = v.get<std::string>();
    for (size_t start = 0;;) {
      const size_t comma = text.find(',', start);
      out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (out.empty()) throw UserError(name + " is an empty list (give a value, or a list of at least one)");
  return out;
}

int count_of(const nlohmann::json& v, const SpaceDimension& d, const std::string& name) {
  if (!v.is_number_integer())
    throw UserError(name + " " + v.dump() + " is not a whole number (valid: a whole number, or a list of them)");
  const long long n = v.get<long long>();
  if (n < d.least || n > INT_MAX)
    throw UserError(name + " " + v.dump() + " is out of range (valid: " + std::to_string(d.least) + " or more)");
  return int(n);
}

std::string name_of(const nlohmann::json& v, const std::string& name) {
  if (!v.is_string()) throw UserError(name + " " + v.dump() + " is not a name (valid: a string, or a list of them)");
  return v.get<std::string>();
}

bool switch_of(const nlohmann::json& v, const std::string& name) {
  if (!v.is_boolean()) throw UserError(name + " " + v.dump() + " is not true or false");
  return v.get<bool>();
}

}  // namespace

SpaceConstraints parse_space_request(const nlohmann::json& request, Naming naming) {
  SpaceConstraints c;
  for (const SpaceDimension& d : space_dimensions()) {
    if (!request.contains(d.key)) continue;
    const std::string name = naming == Naming::Flags ? d.flag : d.key;
    const std::vector<nlohmann::json> values = items(request.at(d.key), d, name);
    switch (d.kind) {
      case DimensionKind::Count:
        (c.*d.counts).emplace();
        for (const auto& v : values) (c.*d.counts)->push_back(count_of(v, d, name));
        break;
      case DimensionKind::Sharding:
        c.sharding.emplace();
        for (const auto& v : values) c.sharding->push_back(parse_optimizer_sharding(name_of(v, name)));
        break;
      case DimensionKind::Recompute:
        c.recompute.emplace();
        for (const auto& v : values) c.recompute->push_back(parse_recompute(name_of(v, name)));
        break;
      case DimensionKind::Switch:
        (c.*d.switches).emplace();
        for (const auto& v : values) (c.*d.switches)->push_back(switch_of(v, name));
        break;
    }
  }
  return c;
}

namespace {

// A pinned parallel size checked alone (the rest of the plan at its defaults), so that its sentence names it.
void check_pins(const ModelSpec& m, const Plan& base, const SpaceConstraints& c, Naming naming) {
  struct Dim {
    const std::optional<std::vector<int>>& given;
    const char* key;
    int Parallel::*member;
  };
  const Dim dims[] = {{c.tp, "tp", &Parallel::tp}, {c.pp, "pp", &Parallel::pp}, {c.vpp, "vpp", &Parallel::vpp},
                      {c.cp, "cp", &Parallel::cp}, {c.ep, "ep", &Parallel::ep}, {c.etp, "etp", &Parallel::etp}};
  for (const Dim& d : dims) {
    for (int v : d.given.value_or(std::vector<int>{})) {
      Plan probe = base;
      probe.parallel = {};
      probe.parallel.*(d.member) = v;
      if (d.member == &Parallel::vpp && v > 1) probe.parallel.pp = 2;  // vpp alone needs some pp to be judged
      probe.moe = {};
      probe.recompute = Recompute::None;
      probe.recompute_layers = 0;
      probe.global_batch = 0;
      if (auto bad = check_plan(m, probe); bad && bad->rule != Rule::BatchDivisible && bad->rule != Rule::VppNeedsPp &&
                                           bad->rule != Rule::LayersSplit)
        throw UserError((naming == Naming::Flags ? "--" : "") + std::string(d.key) + " " + std::to_string(v) +
                        " cannot work: " + bad->message);
    }
  }
}

// A pinned option its framework does not run (estimator/frameworks.h), checked alone: "--ep-chunks 2 cannot work:
// moe.ep_chunks = 2 (chunked EP) is not something megatron runs (run by bumblebee, lcplan-exec)".
void check_framework_pins(const ModelSpec& m, const Plan& base, const SpaceConstraints& c, Naming naming) {
  const auto fail = [&](const char* key, const std::string& value, const Plan& probe) {
    if (const std::string e = framework_support_error(m, probe); !e.empty())
      throw UserError((naming == Naming::Flags ? "--" : "") + std::string(key) + " " + value + " cannot work: " + e);
  };
  for (int v : c.ep_chunks.value_or(std::vector<int>{})) {
    Plan probe = base;
    probe.moe.ep_chunks = v;
    fail(naming == Naming::Flags ? "ep-chunks" : "ep_chunks", std::to_string(v), probe);
  }
  for (bool v : c.linear_ce.value_or(std::vector<bool>{})) {
    Plan probe = base;
    probe.linear_ce = v;
    fail(naming == Naming::Flags ? "linear-ce" : "linear_ce", v ? "true" : "false", probe);
  }
  for (bool v : c.offload_optimizer.value_or(std::vector<bool>{})) {
    Plan probe = base;
    probe.offload.optimizer = v;
    fail(naming == Naming::Flags ? "offload-optimizer" : "offload_optimizer", v ? "true" : "false", probe);
  }
}

// A given dimension: its values replace the default ones, and the base plan takes the first.
template <typename T>
void restrict_to(const std::optional<std::vector<T>>& given, T& base_field, std::vector<T>& space_values) {
  if (!given) return;
  base_field = given->front();
  space_values = *given;
}

}  // namespace

PlanSpace search_space(const ModelSpec& m, Plan& base, const SpaceConstraints& c, Naming naming) {
  // Sizes out of range (--gpus 10000000) get the sentence estimate gives, not a count of rejected candidates.
  if (const auto v = check_plan_sizes(base)) throw UserError(v->message);
  PlanSpace s = default_space(m, base);
  restrict_to(c.tp, base.parallel.tp, s.tp);
  restrict_to(c.pp, base.parallel.pp, s.pp);
  restrict_to(c.vpp, base.parallel.vpp, s.vpp);
  restrict_to(c.cp, base.parallel.cp, s.cp);
  restrict_to(c.ep, base.parallel.ep, s.ep);
  restrict_to(c.etp, base.parallel.etp, s.etp);
  restrict_to(c.micro_batch, base.micro_batch, s.micro_batch);
  restrict_to(c.ep_chunks, base.moe.ep_chunks, s.ep_chunks);
  restrict_to(c.recompute_layers, base.recompute_layers, s.recompute_layers);
  restrict_to(c.sharding, base.optimizer_sharding, s.sharding);
  restrict_to(c.recompute, base.recompute, s.recompute);
  restrict_to(c.linear_ce, base.linear_ce, s.linear_ce);
  restrict_to(c.offload_optimizer, base.offload.optimizer, s.offload_optimizer);
  check_pins(m, base, c, naming);
  check_framework_pins(m, base, c, naming);
  return s;
}

}  // namespace lcplan
