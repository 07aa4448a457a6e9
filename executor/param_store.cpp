#include "executor/param_store.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "executor/ops_math.h"

namespace lcplan::exec {

namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Index of the tensor holding flat element i of a unit's dense or expert array.
int tensor_at(const UnitLayout& u, bool expert, size_t i) {
  int best = -1;
  for (size_t t = 0; t < u.tensors.size(); ++t) {
    const TensorSpec& s = u.tensors[t];
    if (s.expert == expert && i >= s.offset && i < s.offset + s.size) best = int(t);
  }
  return best;
}

}  // namespace

ParamStore::ParamStore(Tracker& t, const comm::ProcessGroups& pg, std::vector<UnitLayout> units,
                       OptimizerSharding mode, uint64_t seed)
    : tr_(t), pg_(pg), layouts_(std::move(units)), mode_(mode) {
  units_.resize(layouts_.size());
  for (size_t u = 0; u < layouts_.size(); ++u) {
    init_part(units_[u].dense, int(u), false, seed);
    init_part(units_[u].expert, int(u), true, seed);
    buffer_elems_ = std::max(buffer_elems_, units_[u].dense.group * units_[u].dense.shard +
                                                units_[u].expert.group * units_[u].expert.shard);
  }
}

void ParamStore::init_part(Part& part, int u, bool expert, uint64_t seed) {
  const UnitLayout& L = layouts_[u];
  for (const TensorSpec& t : L.tensors)
    if (t.expert == expert && t.tp_replicated) part.replicated.push_back({t.offset, t.size});
  part.n = expert ? L.n_expert : L.n_dense;
  part.comm = expert ? &pg_.edp : &pg_.dp_cp;
  part.group = part.comm->size;
  part.index = part.comm->rank;
  part.shard = ceil_div(part.n, size_t(part.group));
  part.mode_fsdp = mode_ == OptimizerSharding::Fsdp;
  part.mode_none = mode_ == OptimizerSharding::None;
  const size_t full = part.shard * part.group;
  const size_t len = part.mode_fsdp ? part.shard : full;
  part.p = Buf<bf16>(tr_, Category::Params, len);
  part.g = Buf<float>(tr_, Category::Grads, len);
  part.opt = Buf<float>(tr_, Category::Optimizer, 3 * part.owned_count());
  // Values depend only on (seed, unit, tensor, global index): every shard is a slice of the same model.
  const size_t first = part.mode_fsdp ? size_t(part.index) * part.shard : 0;
  int t = -1;
  for (size_t i = 0; i < len; ++i) {
    const size_t flat = first + i;
    if (flat >= part.n) break;
    if (t < 0 || flat < L.tensors[t].offset || flat >= L.tensors[t].offset + L.tensors[t].size) t = tensor_at(L, expert, flat);
    const float v = init_value(seed, L.id, t, L.tensors[t], flat - L.tensors[t].offset);
    part.p[i] = float_to_bf16(v);
  }
  // fp32 master weights of the owned elements start from the same values (Megatron keeps fp32 masters of bf16 params).
  const size_t of = part.owned_first(), oc = part.owned_count();
  t = -1;
  for (size_t i = 0; i < oc; ++i) {
    const size_t flat = (part.mode_fsdp ? size_t(part.index) * part.shard : of) + i;
    if (flat >= part.n) break;
    if (t < 0 || flat < L.tensors[t].offset || flat >= L.tensors[t].offset + L.tensors[t].size) t = tensor_at(L, expert, flat);
    part.opt[i] = init_value(seed, L.id, t, L.tensors[t], flat - L.tensors[t].offset);
  }
}

UnitView ParamStore::view(int u) const {
  if (sharded_params()) throw std::logic_error("ParamStore::view under FSDP: gather the unit first");
  return {units_[u].dense.p.data(), units_[u].expert.p.data()};
}

UnitGrad ParamStore::grad(int u) {
  if (sharded_params()) throw std::logic_error("ParamStore::grad under FSDP: use the gradient buffer");
  return {units_[u].dense.g.data(), units_[u].expert.g.data()};
}

size_t ParamStore::unit_buffer_elems(int u) const {
  const Unit& U = units_[u];
  return U.dense.group * U.dense.shard + U.expert.group * U.expert.shard;
}

UnitView ParamStore::gather(int u, bf16* buffer) const {
  const Unit& U = units_[u];
  bf16* d = buffer;
  bf16* e = buffer + U.dense.group * U.dense.shard;
  if (U.dense.shard) comm::all_gather(*U.dense.comm, U.dense.p.data(), d, U.dense.shard, comm::DType::BF16);
  if (U.expert.shard) comm::all_gather(*U.expert.comm, U.expert.p.data(), e, U.expert.shard, comm::DType::BF16);
  return {d, e};
}

UnitGrad ParamStore::buffer_grad(int u, float* buffer) const {
  const Unit& U = units_[u];
  const size_t n = U.dense.group * U.dense.shard + U.expert.group * U.expert.shard;
  std::fill(buffer, buffer + n, 0.0f);
  return {buffer, buffer + U.dense.group * U.dense.shard};
}

void ParamStore::reduce_into_shard(int u, float* buffer) {
  Unit& U = units_[u];
  float* parts[2] = {buffer, buffer + U.dense.group * U.dense.shard};
  Part* ps[2] = {&U.dense, &U.expert};
  for (int k = 0; k < 2; ++k) {
    Part& P = *ps[k];
    if (!P.shard) continue;
    Buf<float> tmp(tr_, Category::Workspace, P.shard);
    comm::reduce_scatter(*P.comm, parts[k], tmp.data(), P.shard, comm::DType::F32, comm::ReduceOp::Sum);
    for (size_t i = 0; i < P.shard; ++i) P.g[i] += tmp[i];
  }
}

void ParamStore::zero_grads() {
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) std::fill(P->g.data(), P->g.data() + P->g.size(), 0.0f);
}

// Elements of `P`'s replicated tensors that this rank holds: [first, last) in its local array (the whole padded
// array, or under FSDP its shard), each paired with the flat index of its first element.
std::vector<std::pair<size_t, size_t>> ParamStore::replicated_held(const Part& P) const {
  std::vector<std::pair<size_t, size_t>> out;
  const size_t base = P.mode_fsdp ? size_t(P.index) * P.shard : 0, len = P.g.size();
  for (const auto& [off, n] : P.replicated) {
    const size_t a = std::max(off, base), b = std::min(off + n, base + len);
    if (a < b) out.push_back({a - base, b - base});
  }
  return out;
}

void ParamStore::sync_tp_replicated() {
  if (pg_.tp.size == 1) return;
  // Weights every TP rank holds whole (norms, router, per-head decay parameters) saw only this rank's sequence shard
  // or heads: their gradients are summed over the TP group (Megatron finalize_model_grads, the sequence-parallel and
  // layernorm gradient all-reduce).
  size_t n = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) n += b - a;
  if (n == 0) return;
  Buf<float> buf(tr_, Category::Workspace, n);
  size_t at = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) {
      std::copy(U.dense.g.data() + a, U.dense.g.data() + b, buf.data() + at);
      at += b - a;
    }
  comm::all_reduce(pg_.tp, buf.data(), n, comm::DType::F32, comm::ReduceOp::Sum);
  at = 0;
  for (Unit& U : units_)
    for (const auto& [a, b] : replicated_held(U.dense)) {
      std::copy(buf.data() + at, buf.data() + at + (b - a), U.dense.g.data() + a);
      at += b - a;
    }
}

void ParamStore::sync_grads() {
  sync_tp_replicated();
  if (mode_ == OptimizerSharding::Fsdp) return;
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) {
      if (!P->shard || P->group == 1) {
        if (mode_ == OptimizerSharding::DistOpt && P->shard) {
          P->reduced = Buf<float>(tr_, Category::Workspace, P->shard);
          std::copy(P->g.data(), P->g.data() + P->shard, P->reduced.data());
        }
        continue;
      }
      if (mode_ == OptimizerSharding::None) {
        comm::all_reduce(*P->comm, P->g.data(), P->g.size(), comm::DType::F32, comm::ReduceOp::Sum);
      } else {
        P->reduced = Buf<float>(tr_, Category::Workspace, P->shard);
        comm::reduce_scatter(*P->comm, P->g.data(), P->reduced.data(), P->shard, comm::DType::F32,
                             comm::ReduceOp::Sum);
      }
    }
}

double ParamStore::grad_sq_owned() const {
  double s = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (layouts_[u].shared_copy) continue;  // the tied embedding is counted on the first stage
    const Unit& U = units_[u];
    for (const Part* P : {&U.dense, &U.expert}) {
      if (!P->shard) continue;
      const float* g = nullptr;
      size_t first = 0;  // global flat index of g[0]
      if (mode_ == OptimizerSharding::Fsdp) {
        g = P->g.data();
        first = size_t(P->index) * P->shard;
      } else if (mode_ == OptimizerSharding::DistOpt) {
        g = P->reduced.data();
        first = size_t(P->index) * P->shard;
      } else {
        g = P->g.data() + size_t(P->index) * P->shard;
        first = size_t(P->index) * P->shard;
      }
      // Replicated tensors are whole on every TP rank: TP rank 0 counts them.
      auto replicated = [&](size_t flat) {
        if (pg_.tp.rank == 0) return false;
        for (const auto& [off, n] : P->replicated)
          if (flat >= off && flat < off + n) return true;
        return false;
      };
      for (size_t i = 0; i < P->shard && first + i < P->n; ++i)
        if (!replicated(first + i)) s += double(g[i]) * g[i];
    }
  }
  return s;
}

void ParamStore::adam_step(int step, const AdamOptions& o) {
  const math::AdamScalars a = math::adam_scalars(o.lr, o.beta1, o.beta2, o.eps, step);
  for (Unit& U : units_)
    for (Part* P : {&U.dense, &U.expert}) {
      if (!P->shard) continue;
      const size_t oc = P->owned_count();
      float* master = P->opt.data();
      float* m = master + oc;
      float* v = m + oc;
      const float* g = mode_ == OptimizerSharding::DistOpt ? P->reduced.data() : P->g.data();
      const size_t pfirst = mode_ == OptimizerSharding::DistOpt ? size_t(P->index) * P->shard : 0;
      for (size_t i = 0; i < oc; ++i) {
        math::adam_update(g[i], m[i], v[i], master[i], a);
        P->p[pfirst + i] = float_to_bf16(master[i]);
      }
      if (mode_ == OptimizerSharding::DistOpt) {
        P->reduced.reset();
        if (P->group > 1) {
          Buf<bf16> mine(tr_, Category::Workspace, P->shard);
          std::copy(P->p.data() + pfirst, P->p.data() + pfirst + P->shard, mine.data());
          comm::all_gather(*P->comm, mine.data(), P->p.data(), P->shard, comm::DType::BF16);
        }
      }
    }
}

double ParamStore::local_param_elems() const {
  double n = 0;
  for (const Unit& U : units_) {
    n += mode_ == OptimizerSharding::Fsdp ? double(U.dense.shard + U.expert.shard) : double(U.dense.n + U.expert.n);
  }
  return n;
}

}  // namespace lcplan::exec
