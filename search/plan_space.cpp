#include "search/plan_space.h"

#include <algorithm>

namespace lcplan {

namespace {

std::vector<int> powers_of_two(int max_value) {
  std::vector<int> v;
  for (int x = 1; x <= max_value; x *= 2) v.push_back(x);
  return v;
}

bool has_moe(const ModelSpec& m) {
  return std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
}

}  // namespace

PlanSpace default_space(const ModelSpec& m, const Plan& base) {
  PlanSpace s;
  const int g = base.gpus;
  const int node = base.gpus_per_node > 0 ? base.gpus_per_node : 8;
  s.tp = powers_of_two(std::min(node, g));                 // TP beyond a node is never worth it (collectives per layer)
  s.pp = powers_of_two(std::min(16, g));
  s.vpp = {1, 2, 4};
  s.cp = powers_of_two(std::min(32, g));
  s.ep = has_moe(m) ? powers_of_two(std::min(m.moe.num_experts, g)) : std::vector<int>{1};
  s.etp = has_moe(m) ? std::vector<int>{1, 2} : std::vector<int>{1};
  s.micro_batch = base.seq_len >= 32768 ? std::vector<int>{1} : std::vector<int>{1, 2, 4};
  s.ep_chunks = has_moe(m) ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{1};
  s.recompute_fractions = {1.0, 0.5};
  s.sharding = {OptimizerSharding::DistOpt, OptimizerSharding::Fsdp, OptimizerSharding::None};
  s.recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  s.linear_ce = {true, false};
  s.offload_optimizer = {false, true};
  return s;
}

size_t PlanSpace::size() const {
  size_t rec = 0;
  for (Recompute r : recompute)
    rec += r == Recompute::Full ? (recompute_layers.empty() ? recompute_fractions.size() : recompute_layers.size()) : 1;
  return tp.size() * pp.size() * vpp.size() * cp.size() * ep.size() * etp.size() * micro_batch.size() *
         ep_chunks.size() * sharding.size() * rec * linear_ce.size() * offload_optimizer.size();
}

}  // namespace lcplan
