// The definitions of BasicParamStore<Mem> (param_store.h), included by the translation units that instantiate it:
// param_store.cpp (HostMem) and param_store_cuda.cpp (DeviceMem). Every touch of an array goes through mem_, so the
// two stores differ only in where the arrays live and which communicator moves them.
#pragma once

#include <algorithm>
#include <stdexcept>

#include "executor/param_store.h"

namespace lcplan::exec {

namespace store_detail {

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Index of the tensor holding flat element i of a unit's dense or expert array.
inline int tensor_at(const UnitLayout& u, bool expert, size_t i) {
  int best = -1;
  for (size_t t = 0; t < u.tensors.size(); ++t) {
    const TensorSpec& s = u.tensors[t];
    if (s.expert == expert && i >= s.offset && i < s.offset + s.size) best = int(t);
  }
  return best;
}

}  // namespace store_detail

template <class Mem>
BasicParamStore<Mem>::BasicParamStore(Tracker& t, const comm::ProcessGroups& pg, std::vector<UnitLayout> units,
                                      OptimizerSharding mode, uint64_t seed, Mem mem)
    : tr_(t), pg_(pg), layouts_(std::move(units)), mode_(mode), mem_(std::move(mem)) {
  for (const comm::Comm* c : {&pg_.dp_cp, &pg_.edp, &pg_.tp}) mem_.check(*c);
  units_.resize(layouts_.size());
  for (size_t u = 0; u < layouts_.size(); ++u) {
    init_part(units_[u].dense, int(u), false, seed);
    init_part(units_[u].expert, int(u), true, seed);
    buffer_elems_ = std::max(buffer_elems_, units_[u].dense.group * units_[u].dense.shard +
                                                units_[u].expert.group * units_[u].expert.shard);
  }
}

template <class Mem>
void BasicParamStore<Mem>::init_part(Part& part, int u, bool expert, uint64_t seed) {
  const UnitLayout& L = layouts_[u];
  for (const TensorSpec& t : L.tensors)
    if (t.expert == expert && t.tp_replicated) part.replicated.push_back({t.offset, t.size});
  part.n = expert ? L.n_expert : L.n_dense;
  part.comm = expert ? &pg_.edp : &pg_.dp_cp;
  part.group = part.comm->size;
  part.index = part.comm->rank;
  part.shard = store_detail::ceil_div(part.n, size_t(part.group));
  part.mode_fsdp = mode_ == OptimizerSharding::Fsdp;
  part.mode_none = mode_ == OptimizerSharding::None;
  const size_t full = part.shard * part.group;
  const size_t len = part.mode_fsdp ? part.shard : full;
  part.p = Buffer<bf16>(tr_, Category::Params, len);
  part.g = Buffer<float>(tr_, Category::Grads, len);
  part.opt = Buffer<float>(tr_, Category::Optimizer, 3 * part.owned_count());
  // Values depend only on (seed, unit, tensor, global index): every shard is a slice of the same model. They are
  // made on the host and uploaded (padding stays zero, as the buffers start).
  auto value = [&](size_t flat, int& t) {
    if (t < 0 || flat < L.tensors[t].offset || flat >= L.tensors[t].offset + L.tensors[t].size)
      t = store_detail::tensor_at(L, expert, flat);
    return init_value(seed, L.id, t, L.tensors[t], flat - L.tensors[t].offset);
  };
  const size_t first = part.mode_fsdp ? size_t(part.index) * part.shard : 0;
  std::vector<bf16> p(len, float_to_bf16(0.0f));
  int t = -1;
  for (size_t i = 0; i < len && first + i < part.n; ++i) p[i] = float_to_bf16(value(first + i, t));
  mem_.upload(p, part.p.data());
  // fp32 master weights of the owned elements start from the same values (Megatron keeps fp32 masters of bf16
  // params); the Adam moments after them start at zero.
  const size_t owned = part.mode_fsdp ? size_t(part.index) * part.shard : part.owned_first();
  std::vector<float> opt(3 * part.owned_count(), 0.0f);
  t = -1;
  for (size_t i = 0; i < part.owned_count() && owned + i < part.n; ++i) opt[i] = value(owned + i, t);
  mem_.upload(opt, part.opt.data());
}

template <class Mem>
UnitView BasicParamStore<Mem>::view(int u) const {
  if (sharded_params()) throw std::logic_error("ParamStore::view under FSDP: gather the unit first");
  return {units_[u].dense.p.data(), units_[u].expert.p.data()};
}

template <class Mem>
UnitGrad BasicParamStore<Mem>::grad(int u) {
  if (sharded_params()) throw std::logic_error("ParamStore::grad under FSDP: use the gradient buffer");
  return {units_[u].dense.g.data(), units_[u].expert.g.data()};
}

template <class Mem>
size_t BasicParamStore<Mem>::unit_buffer_elems(int u) const {
  const Unit& U = units_[u];
  return U.dense.group * U.dense.shard + U.expert.group * U.expert.shard;
}

template <class Mem>
UnitView BasicParamStore<Mem>::gather(int u, bf16* buffer) const {
  const Unit& U = units_[u];
  bf16* d = buffer;
  bf16* e = buffer + U.dense.group * U.dense.shard;
  if (U.dense.shard) comm::all_gather(*U.dense.comm, U.dense.p.data(), d, U.dense.shard, comm::DType::BF16);
  if (U.expert.shard) comm::all_gather(*U.expert.comm, U.expert.p.data(), e, U.expert.shard, comm::DType::BF16);
  return {d, e};
}

template <class Mem>
UnitGrad BasicParamStore<Mem>::buffer_grad(int u, float* buffer) const {
  const Unit& U = units_[u];
  mem_.zero(buffer, unit_buffer_elems(u));
  return {buffer, buffer + U.dense.group * U.dense.shard};
}

template <class Mem>
void BasicParamStore<Mem>::reduce_into_shard(int u, float* buffer) {
  Unit& U = units_[u];
  float* parts[2] = {buffer, buffer + U.dense.group * U.dense.shard};
  Part* ps[2] = {&U.dense, &U.expert};
  for (int k = 0; k < 2; ++k) {
    Part& P = *ps[k];
    if (!P.shard) continue;
    Buffer<float> tmp(tr_, Category::Workspace, P.shard);
    comm::reduce_scatter(*P.comm, parts[k], tmp.data(), P.shard, comm::DType::F32, comm::ReduceOp::Sum);
    mem_.add(tmp.data(), P.shard, P.g.data());
  }
}

template <class Mem>
void BasicParamStore<Mem>::zero_grads() {
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) mem_.zero(P->g.data(), P->g.size());
}

// Elements of `P`'s replicated tensors that this rank holds: [first, last) in its local array (the whole padded
// array, or under FSDP its shard).
template <class Mem>
Ranges BasicParamStore<Mem>::replicated_held(const Part& P) const {
  Ranges out;
  const size_t base = P.mode_fsdp ? size_t(P.index) * P.shard : 0, len = P.g.size();
  for (const auto& [off, n] : P.replicated) {
    const size_t a = std::max(off, base), b = std::min(off + n, base + len);
    if (a < b) out.push_back({a - base, b - base});
  }
  return out;
}

template <class Mem>
void BasicParamStore<Mem>::sync_tp_replicated() {
  if (pg_.tp.size == 1) return;
  // Weights every TP rank holds whole (norms, router, per-head decay parameters) saw only this rank's sequence shard
  // or heads: their gradients are summed over the TP group (Megatron finalize_model_grads, the sequence-parallel and
  // layernorm gradient all-reduce).
  size_t n = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) n += b - a;
  if (n == 0) return;
  Buffer<float> buf(tr_, Category::Workspace, n);
  size_t at = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) {
      mem_.copy(U.dense.g.data() + a, b - a, buf.data() + at);
      at += b - a;
    }
  comm::all_reduce(pg_.tp, buf.data(), n, comm::DType::F32, comm::ReduceOp::Sum);
  at = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) {
      mem_.copy(buf.data() + at, b - a, U.dense.g.data() + a);
      at += b - a;
    }
}

template <class Mem>
void BasicParamStore<Mem>::sync_grads() {
  sync_tp_replicated();
  if (mode_ == OptimizerSharding::Fsdp) return;
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) {
      if (!P->shard || P->group == 1) {
        if (mode_ == OptimizerSharding::DistOpt && P->shard) P->reduced = P->g.data();  // one rank: g is the shard
        continue;
      }
      if (mode_ == OptimizerSharding::None) {
        comm::all_reduce(*P->comm, P->g.data(), P->g.size(), comm::DType::F32, comm::ReduceOp::Sum);
      } else {
        float* mine = P->g.data() + size_t(P->index) * P->shard;  // reduced in place, no second buffer
        comm::reduce_scatter(*P->comm, P->g.data(), mine, P->shard, comm::DType::F32, comm::ReduceOp::Sum);
        P->reduced = mine;
      }
    }
}

template <class Mem>
double BasicParamStore<Mem>::grad_sq_owned() const {
  double s = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (layouts_[u].shared_copy) continue;  // the tied embedding is counted on the first stage
    const Unit& U = units_[u];
    for (const Part* P : {&U.dense, &U.expert}) {
      if (!P->shard) continue;
      if (mode_ == OptimizerSharding::DistOpt && P->reduced == nullptr)
        throw std::logic_error("ParamStore::grad_sq_owned under dist_opt: call sync_grads first (it reduces the shard)");
      // This rank's owned gradients: the FSDP shard, the dist-opt reduced shard, or its slice of the whole array.
      const size_t first = size_t(P->index) * P->shard;
      const float* g = mode_ == OptimizerSharding::Fsdp      ? P->g.data()
                       : mode_ == OptimizerSharding::DistOpt ? P->reduced
                                                             : P->g.data() + first;
      const size_t count = first < P->n ? std::min(P->shard, P->n - first) : 0;
      // Replicated tensors are whole on every TP rank: TP rank 0 counts them.
      s += mem_.sum_squares(g, counted_ranges(first, count, P->replicated, pg_.tp.rank != 0));
    }
  }
  return s;
}

template <class Mem>
void BasicParamStore<Mem>::adam_step(int step, const AdamOptions& o) {
  const math::AdamScalars a = math::adam_scalars(o.lr, o.beta1, o.beta2, o.eps, step);
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) {
      if (!P->shard) continue;
      const size_t oc = P->owned_count();
      float* master = P->opt.data();
      if (mode_ == OptimizerSharding::DistOpt && P->reduced == nullptr)
        throw std::logic_error("ParamStore::adam_step under dist_opt: call sync_grads first (it reduces the shard)");
      const float* g = mode_ == OptimizerSharding::DistOpt ? P->reduced : P->g.data();
      const size_t pfirst = mode_ == OptimizerSharding::DistOpt ? size_t(P->index) * P->shard : 0;
      mem_.adam(g, master + oc, master + 2 * oc, master, P->p.data() + pfirst, oc, a);
      if (mode_ == OptimizerSharding::DistOpt) {
        P->reduced = nullptr;
        if (P->group > 1) {
          Buffer<bf16> mine(tr_, Category::Workspace, P->shard);
          mem_.copy(P->p.data() + pfirst, P->shard, mine.data());
          comm::all_gather(*P->comm, mine.data(), P->p.data(), P->shard, comm::DType::BF16);
        }
      }
    }
}

template <class Mem>
double BasicParamStore<Mem>::local_param_elems() const {
  double n = 0;
  for (const Unit& U : units_) {
    n += mode_ == OptimizerSharding::Fsdp ? double(U.dense.shard + U.expert.shard) : double(U.dense.n + U.expert.n);
  }
  return n;
}

}  // namespace lcplan::exec
