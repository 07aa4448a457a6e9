// The plan space the search walks: every dimension a list of values; flags pin or restrict dimensions.
#pragma once

#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct PlanSpace {
  std::vector<int> tp, pp, vpp, cp, ep, etp, micro_batch, ep_chunks;
  std::vector<OptimizerSharding> sharding;
  std::vector<Recompute> recompute;
  // Full recompute only: explicit layer counts per virtual stage (0 = all) when pinned, else these fractions of
  // the layers of a virtual stage (1 = all).
  std::vector<int> recompute_layers;
  std::vector<double> recompute_fractions;
  std::vector<bool> linear_ce, offload_optimizer;
  std::vector<bool> a2a_overlap = {false};  // Megatron's cross-microbatch EP overlap (frameworks that run it)

  size_t size() const;  // candidate count before any rule is checked
};

// Every dimension free: powers of two bounded by the model (heads, experts, layers) and the GPU count, and of the
// options only what the base plan's framework runs (estimator/frameworks.h): chunked EP for bumblebee and
// lcplan-exec, the cross-microbatch EP overlap for Megatron, optimizer offload where its requirements hold.
PlanSpace default_space(const ModelSpec& m, const Plan& base);

// Mixed-radix counter over dimension sizes, last dimension fastest.
class Odometer {
 public:
  explicit Odometer(std::vector<size_t> sizes);
  bool done() const { return done_; }
  void next();
  size_t operator[](size_t dim) const { return idx_[dim]; }
  size_t count() const;  // every combination

 private:
  std::vector<size_t> sizes_, idx_;
  bool done_ = false;
};

// The search walks a PlanSpace as two odometers: layouts (tp, pp, vpp, cp, ep, etp, micro_batch) outside, options
// (ep_chunks, sharding, linear_ce, optimizer offload, recompute with its layers, EP overlap) inside, so that a layout
// a rule rejects is skipped together with every option it stands for.
class LayoutWalk {
 public:
  explicit LayoutWalk(const PlanSpace& s);
  bool done() const { return odo_.done(); }
  void next() { odo_.next(); }
  void apply(Plan& p) const;  // sets parallel sizes and micro batch

 private:
  const PlanSpace& s_;
  Odometer odo_;
};

class OptionWalk {
 public:
  explicit OptionWalk(const PlanSpace& s);
  bool done() const { return odo_.done(); }
  void next() { odo_.next(); }
  size_t count() const { return odo_.count(); }
  // Sets the options; `chunk_layers` is the most layers a virtual stage holds (recompute fractions apply to it).
  // False when a recompute fraction rounds to a layer count another choice already covers: the same plan, skip it.
  bool apply(Plan& p, int chunk_layers) const;

 private:
  struct RecomputeChoice {
    Recompute mode;
    int layers;       // explicit layers per virtual stage (0 = all)
    double fraction;  // < 0: use `layers`; else this fraction of a virtual stage's layers (1 = all)
  };
  static std::vector<RecomputeChoice> recompute_choices(const PlanSpace& s);
  const PlanSpace& s_;
  std::vector<RecomputeChoice> recompute_;
  Odometer odo_;
};

}  // namespace lcplan
