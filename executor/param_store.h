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
//
// One store, two memories: BasicParamStore<Mem> runs the same code (param_store_impl.h) on host arrays with MPI
// groups (HostMem, the CPU backend's ParamStore) and on device arrays with NCCL groups (DeviceMem,
// param_store_cuda.h), so the CPU tests cover the device store's sharding, collective order and norm bookkeeping.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "estimator/plan.h"
#include "executor/exec_model.h"
#include "executor/ops_math.h"
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

// [first, last) element ranges of a local array, ascending and disjoint.
using Ranges = std::vector<std::pair<size_t, size_t>>;

// The elements of a local gradient array a rank counts in the gradient norm: local indices [0, count) holding flat
// elements first.., minus (when drop_replicated) the flat ranges `replicated` (offset, size) cover. Pure.
Ranges counted_ranges(size_t first, size_t count, const Ranges& replicated, bool drop_replicated);

// Host memory, MPI groups: the CPU backend. Every method is the plain loop the device version mirrors.
struct HostMem {
  template <class T>
  using Buffer = Buf<T>;
  void check(const comm::Comm& c) const;  // throws std::invalid_argument unless c is an MPI communicator
  void zero(float* x, size_t n) const;
  void copy(const float* src, size_t n, float* dst) const;
  void copy(const bf16* src, size_t n, bf16* dst) const;
  void add(const float* x, size_t n, float* y) const;  // y += x
  void upload(const std::vector<float>& h, float* d) const;
  void upload(const std::vector<bf16>& h, bf16* d) const;
  double sum_squares(const float* g, const Ranges& r) const;  // fp64, ranges in order, elements in order
  // Adam over n elements; p (may be null) gets bf16(master).
  void adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n, const math::AdamScalars& a) const;
};

template <class Mem>
class BasicParamStore {
 public:
  template <class T>
  using Buffer = typename Mem::template Buffer<T>;

  // Throws std::invalid_argument when a group's communicator is not the memory's kind (Mem::check).
  BasicParamStore(Tracker& t, const comm::ProcessGroups& pg, std::vector<UnitLayout> units, OptimizerSharding mode,
                  uint64_t seed, Mem mem = Mem{});

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
    Buffer<bf16> p;        // whole padded (none, dist_opt) or shard (fsdp)
    Buffer<float> g;       // same length as p
    const float* reduced = nullptr;  // dist_opt: this rank's reduced shard, in place in g (Megatron's shard view of
                                     // its grad buffer), set by sync_grads until adam_step
    Buffer<float> opt;     // master | m | v over the owned elements
    Ranges replicated;     // (offset, size) of TP-replicated tensors (dense part)
    size_t owned_first() const { return mode_fsdp ? 0 : (mode_none ? 0 : size_t(index) * shard); }
    size_t owned_count() const { return mode_none ? group * shard : shard; }
    bool mode_fsdp = false, mode_none = false;
  };
  struct Unit {
    Part dense, expert;
  };
  void init_part(Part& part, int u, bool expert, uint64_t seed);
  Ranges replicated_held(const Part& P) const;
  void sync_tp_replicated();
  Tracker& tr_;
  const comm::ProcessGroups& pg_;
  std::vector<UnitLayout> layouts_;
  std::vector<Unit> units_;
  OptimizerSharding mode_;
  size_t buffer_elems_ = 0;
  Mem mem_;
};

// The CPU backend's store (param_store.cpp instantiates it).
extern template class BasicParamStore<HostMem>;
using ParamStore = BasicParamStore<HostMem>;

}  // namespace lcplan::exec
