#include "search/plan_space.h"

#include <algorithm>
#include <stdexcept>

#include "estimator/frameworks.h"
#include "parallel/chunk_schedule.h"

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
  // GPUs per NVLink domain, resolved when the plan was loaded (estimator/derived_plan.h nvlink_domain_gpus).
  if (base.gpus_per_node <= 0) throw std::invalid_argument("default_space needs the plan's gpus_per_node (load_plan_inputs)");
  const int node = base.gpus_per_node;
  s.tp = powers_of_two(std::min(node, g));                 // TP beyond a node is never worth it (collectives per layer)
  s.pp = powers_of_two(std::min(16, g));
  s.vpp = {1, 2, 4};
  s.cp = powers_of_two(std::min(32, g));
  s.ep = has_moe(m) ? powers_of_two(std::min(m.moe.num_experts, g)) : std::vector<int>{1};
  s.etp = has_moe(m) ? std::vector<int>{1, 2} : std::vector<int>{1};
  s.micro_batch = base.seq_len >= 32768 ? std::vector<int>{1} : std::vector<int>{1, 2, 4};
  // The options its framework runs (a name no table row has runs everything, as before frameworks had rows).
  const Framework* fw = find_framework(base.implementation);
  const auto runs = [&](bool Capabilities::*c) { return !fw || fw->can.*c; };
  s.ep_chunks = {1};
  if (has_moe(m) && runs(&Capabilities::chunked_ep))
    for (int n = 2; n <= moe::kMaxChunks; ++n) s.ep_chunks.push_back(n);
  s.recompute_fractions = {1.0, 0.5};
  s.sharding = {OptimizerSharding::DistOpt, OptimizerSharding::Fsdp, OptimizerSharding::None};
  s.recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  s.linear_ce = runs(&Capabilities::linear_ce) ? std::vector<bool>{true, false} : std::vector<bool>{false};
  // Megatron-LM offloads the optimizer only with the precision-aware optimizer and without fp8 parameters, and runs
  // the EP overlap without the moe recompute module (frameworks.cpp megatron_requirements).
  const bool fp8_params = base.fp8.param_gather && base.precision != Precision::BF16;
  const bool offload = runs(&Capabilities::optimizer_offload) &&
                       (!fw || !fw->can.offload_needs_precision_aware || (base.optimizer.precision_aware && !fp8_params));
  s.offload_optimizer = offload ? std::vector<bool>{false, true} : std::vector<bool>{false};
  const bool overlap = has_moe(m) && fw && fw->can.ep_overlap && !(base.recompute_modules & kRecomputeMoe);
  s.a2a_overlap = overlap ? std::vector<bool>{false, true} : std::vector<bool>{false};
  if (base.moe.a2a_overlap) s.a2a_overlap = {true};  // asked for (--a2a-overlap)
  return s;
}

Odometer::Odometer(std::vector<size_t> sizes) : sizes_(std::move(sizes)), idx_(sizes_.size(), 0) {
  done_ = count() == 0;
}

size_t Odometer::count() const {
  size_t n = 1;
  for (size_t s : sizes_) n *= s;
  return n;
}

void Odometer::next() {
  for (size_t d = sizes_.size(); d-- > 0;) {
    if (++idx_[d] < sizes_[d]) return;
    idx_[d] = 0;
  }
  done_ = true;
}

LayoutWalk::LayoutWalk(const PlanSpace& s)
    : s_(s), odo_({s.tp.size(), s.pp.size(), s.vpp.size(), s.cp.size(), s.ep.size(), s.etp.size(), s.micro_batch.size()}) {}

void LayoutWalk::apply(Plan& p) const {
  p.parallel = {s_.tp[odo_[0]], s_.pp[odo_[1]], s_.vpp[odo_[2]], s_.cp[odo_[3]], s_.ep[odo_[4]], s_.etp[odo_[5]]};
  p.micro_batch = s_.micro_batch[odo_[6]];
}

std::vector<OptionWalk::RecomputeChoice> OptionWalk::recompute_choices(const PlanSpace& s) {
  std::vector<RecomputeChoice> out;
  for (Recompute r : s.recompute) {
    if (r != Recompute::Full) out.push_back({r, 0, -1});
    else if (!s.recompute_layers.empty())
      for (int n : s.recompute_layers) out.push_back({r, n, -1});
    else
      for (double f : s.recompute_fractions) out.push_back({r, 0, f});
  }
  return out;
}

OptionWalk::OptionWalk(const PlanSpace& s)
    : s_(s),
      recompute_(recompute_choices(s)),
      odo_({s.ep_chunks.size(), s.sharding.size(), s.linear_ce.size(), s.offload_optimizer.size(), recompute_.size(),
            s.a2a_overlap.size()}) {}

bool OptionWalk::apply(Plan& p, int chunk_layers) const {
  p.moe.ep_chunks = s_.ep_chunks[odo_[0]];
  p.optimizer_sharding = s_.sharding[odo_[1]];
  p.linear_ce = s_.linear_ce[odo_[2]];
  p.offload.optimizer = s_.offload_optimizer[odo_[3]];
  const RecomputeChoice& rc = recompute_[odo_[4]];
  p.recompute = rc.mode;
  p.recompute_layers = rc.layers;
  p.moe.a2a_overlap = s_.a2a_overlap[odo_[5]];
  if (rc.fraction >= 0) {
    // Fractions that round to "all" or repeat a count are the same plan.
    const int n = rc.fraction >= 1.0 ? 0 : std::max(1, static_cast<int>(rc.fraction * chunk_layers));
    if (rc.fraction < 1.0 && n >= chunk_layers) return false;
    p.recompute_layers = n;
  }
  return true;
}

size_t PlanSpace::size() const {
  size_t rec = 0;
  for (Recompute r : recompute)
    rec += r == Recompute::Full ? (recompute_layers.empty() ? recompute_fractions.size() : recompute_layers.size()) : 1;
  return tp.size() * pp.size() * vpp.size() * cp.size() * ep.size() * etp.size() * micro_batch.size() *
         ep_chunks.size() * sharding.size() * rec * linear_ce.size() * offload_optimizer.size() * a2a_overlap.size();
}

}  // namespace lcplan
