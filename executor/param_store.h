// Parameters, main gradients and optimizer state of one rank under the plan's optimizer sharding, stored in the sizes
// the estimator counts (estimator/memory_model.cpp): bf16 weights, fp32 main gradients, fp32 master + Adam moments
// (12 bytes per parameter). Every unit's dense array is sharded over the DP*CP group and its expert array (this EP
// rank's routed experts) over the expert-DP group (Megatron's distributed optimizer / FSDP groups):
//   none:     params and grads whole; optimizer whole; gradients all-reduced after backward.
//   dist_opt: params and grads whole; optimizer for this rank's shard; gradients reduce-scattered, the updated
//             shard all-gathered back into the bf16 params.
//   fsdp:     params, grads and optimizer for this rank's shard only; a unit is all-gathered into a buffer before use
//             and its unsharded gradient reduce-scattered into the shard after its backward.
// Arrays are padded to a multiple of the group size (at most group-1 elements per unit).
#pragma once

#include <cstdint>
#include <vector>

#include "estimator/plan.h"
#include "executor/exec_model.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/groups.h"
#include "kernels/common/bf16.h"

namespace lcplan::exec {

struct UnitView {
  const bf16* dense = nullptr;
  const bf16* expert = nullptr;
};
struct UnitGrad {
  float* dense = nullptr;
  float* expert = nullptr;
};

struct AdamOptions {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // Megatron-LM defaults for beta2 in MoE recipes
};

class ParamStore {
 public:
  ParamStore(Tracker& t, const comm::ProcessGroups& pg, std::vector<UnitLayout> units, OptimizerSharding mode,
             uint64_t seed);

  OptimizerSharding mode() const { return mode_; }
  const std::vector<UnitLayout>& units() const { return layouts_; }
  bool sharded_params() const { return mode_ == OptimizerSharding::Fsdp; }

  // none / dist_opt: the whole unit in place; fsdp: not available (gather first).
  UnitView view(int u) const;
  UnitGrad grad(int u);

  // FSDP: elements of the gather buffer (largest unit, padded), and the gather / gradient reduction of one unit.
  size_t buffer_elems() const { return buffer_elems_; }
  size_t unit_buffer_elems(int u) const;  // unit u's padded [dense | expert] length
  UnitView gather(int u, bf16* buffer) const;            // all-gather unit u's shards into buffer
  UnitGrad buffer_grad(int u, float* buffer) const;      // views of a zeroed fp32 gradient buffer for unit u
  void reduce_into_shard(int u, float* buffer);          // reduce-scatter the buffer's gradient into u's shard grads

  // The local gradient array of unit u's dense part (whole padded, or the FSDP shard): the tied embedding's copies
  // on the first and last pipeline stage are summed through it.
  float* dense_grad_array(int u) { return units_[u].dense.g.data(); }
  size_t dense_grad_size(int u) const { return units_[u].dense.g.size(); }

  void zero_grads();
  // After the last backward of a step: TP-replicated weights' gradients summed over TP, then gradients summed over
  // data-parallel replicas where the mode keeps them (none: all-reduce; dist_opt: reduce-scatter into this rank's
  // shard; fsdp: already done per unit).
  void sync_grads();
  // Sum of squared gradients this rank owns (its dist-opt shard; TP-replicated tensors on TP rank 0, the tied
  // embedding on the first stage: every parameter counted once across the job).
  double grad_sq_owned() const;
  // Adam on the owned shard (Megatron: bias-corrected, no weight decay here); dist_opt gathers the new bf16 params.
  void adam_step(int step, const AdamOptions& o);
  // Parameters on this rank, unpadded (for the record).
  double local_param_elems() const;

 private:
  struct Part {
    size_t n = 0;       // unsharded elements on this rank's view (experts: local ones)
    size_t shard = 0;   // ceil(n / group)
    int group = 1, index = 0;
    const comm::Comm* comm = nullptr;
    Buf<bf16> p;        // whole padded (none, dist_opt) or shard (fsdp)
    Buf<float> g;       // same length as p
    Buf<float> reduced; // dist_opt: this rank's reduced gradient shard between sync_grads and adam_step
    Buf<float> opt;     // master | m | v over the owned elements
    std::vector<std::pair<size_t, size_t>> replicated;  // (offset, size) of TP-replicated tensors (dense part)
    size_t owned_first() const { return mode_fsdp ? 0 : (mode_none ? 0 : size_t(index) * shard); }
    size_t owned_count() const { return mode_none ? group * shard : shard; }
    bool mode_fsdp = false, mode_none = false;
  };
  struct Unit {
    Part dense, expert;
  };
  void init_part(Part& part, int u, bool expert, uint64_t seed);
  std::vector<std::pair<size_t, size_t>> replicated_held(const Part& P) const;
  void sync_tp_replicated();
  Tracker& tr_;
  const comm::ProcessGroups& pg_;
  std::vector<UnitLayout> layouts_;
  std::vector<Unit> units_;
  OptimizerSharding mode_;
  size_t buffer_elems_ = 0;
};

}  // namespace lcplan::exec
