#include "search/space_constraints.h"

#include "common/user_error.h"
#include "estimator/plan_rules.h"

namespace lcplan {

PlanSpace constrained_space(const ModelSpec& m, const Plan& base, const SpaceConstraints& c, const std::string& prefix) {
  PlanSpace s = default_space(m, base);
  struct Dim {
    const std::optional<std::vector<int>>& given;
    const char* name;
    std::vector<int>& values;
    int Parallel::*member;
  };
  Dim dims[] = {{c.tp, "tp", s.tp, &Parallel::tp},   {c.pp, "pp", s.pp, &Parallel::pp},
                {c.vpp, "vpp", s.vpp, &Parallel::vpp}, {c.cp, "cp", s.cp, &Parallel::cp},
                {c.ep, "ep", s.ep, &Parallel::ep},   {c.etp, "etp", s.etp, &Parallel::etp}};
  for (auto& d : dims) {
    if (!d.given) continue;
    d.values = *d.given;
    for (int v : d.values) {
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
        throw UserError(prefix + d.name + " " + std::to_string(v) + " cannot work: " + bad->message);
    }
  }
  if (c.micro_batch) s.micro_batch = *c.micro_batch;
  if (c.ep_chunks) s.ep_chunks = *c.ep_chunks;
  if (c.recompute_layers) s.recompute_layers = *c.recompute_layers;
  if (c.sharding) s.sharding = *c.sharding;
  if (c.recompute) s.recompute = *c.recompute;
  if (c.linear_ce) s.linear_ce = *c.linear_ce;
  if (c.offload_optimizer) s.offload_optimizer = *c.offload_optimizer;
  return s;
}

}  // namespace lcplan
