#include "executor/param_store.h"

#include <algorithm>
#include <stdexcept>

#include "executor/param_store_impl.h"

namespace lcplan::exec {

Ranges counted_ranges(size_t first, size_t count, const Ranges& replicated, bool drop_replicated) {
  if (count == 0) return {};
  if (!drop_replicated) return {{0, count}};
  Ranges holes;  // the replicated flat ranges inside [first, first + count), as local indices
  for (const auto& [off, n] : replicated) {
    const size_t a = std::max(off, first), b = std::min(off + n, first + count);
    if (a < b) holes.push_back({a - first, b - first});
  }
  std::sort(holes.begin(), holes.end());
  Ranges out;
  size_t at = 0;
  for (const auto& [a, b] : holes) {
    if (a > at) out.push_back({at, a});
    at = std::max(at, b);
  }
  if (at < count) out.push_back({at, count});
  return out;
}

void HostMem::check(const comm::Comm& c) const {
  if (c.backend != comm::Backend::Mpi)
    throw std::invalid_argument("a host parameter store needs MPI process groups, got an NCCL communicator");
}

void HostMem::zero(float* x, size_t n) const { std::fill(x, x + n, 0.0f); }
void HostMem::copy(const float* src, size_t n, float* dst) const { std::copy(src, src + n, dst); }
void HostMem::copy(const bf16* src, size_t n, bf16* dst) const { std::copy(src, src + n, dst); }
void HostMem::add(const float* x, size_t n, float* y) const {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}
void HostMem::upload(const std::vector<float>& h, float* d) const { std::copy(h.begin(), h.end(), d); }
void HostMem::upload(const std::vector<bf16>& h, bf16* d) const { std::copy(h.begin(), h.end(), d); }

double HostMem::sum_squares(const float* g, const Ranges& r) const {
  double s = 0;
  for (const auto& [a, b] : r)
    for (size_t i = a; i < b; ++i) s += double(g[i]) * g[i];
  return s;
}

void HostMem::adam(const float* g, float* m, float* v, float* master, bf16* p, size_t n,
                   const math::AdamScalars& a) const {
  for (size_t i = 0; i < n; ++i) {
    math::adam_update(g[i], m[i], v[i], master[i], a);
    if (p) p[i] = float_to_bf16(master[i]);
  }
}

template class BasicParamStore<HostMem>;

}  // namespace lcplan::exec
