// Validation, scale and memory bounds shared by the CPU, reference and CUDA paths.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/linear_attention/linear_attention.h"

namespace lcplan::linear_attention {

namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("linear_attention: " + what); }

std::string n(int64_t x) { return std::to_string(x); }

}  // namespace

void validate(const Shape& s, const Options& o) {
  if (s.s < 0) bad("tokens s (" + n(s.s) + ") must be >= 0.");
  if (s.hk <= 0) bad("key heads hk (" + n(s.hk) + ") must be >= 1.");
  if (s.hv <= 0 || s.hv % s.hk != 0)
    bad("value heads hv (" + n(s.hv) + ") must be a positive multiple of key heads hk (" + n(s.hk) + ").");
  if (s.dk <= 0) bad("key head dim dk (" + n(s.dk) + ") must be >= 1.");
  if (s.dv <= 0) bad("value head dim dv (" + n(s.dv) + ") must be >= 1.");
  if (o.chunk <= 0) bad("chunk (" + n(o.chunk) + ") must be >= 1.");
  if (!(o.l2norm_eps >= 0.0f) || !std::isfinite(o.l2norm_eps))
    bad("l2norm_eps (" + std::to_string(o.l2norm_eps) + ") must be finite and >= 0.");
  if (!(o.scale >= 0.0f) || !std::isfinite(o.scale))
    bad("scale (" + std::to_string(o.scale) + ") must be a finite value > 0, or 0 for 1/sqrt(dk).");
}

float resolved_scale(const Shape& s, const Options& o) {
  return o.scale > 0.0f ? o.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.dk)));
}

namespace {

// Floats of the chunk step's scratch (see ChunkScratch in linear_attention_cpu.cpp).
size_t chunk_floats(const Shape& s, int64_t c) {
  const size_t C = static_cast<size_t>(c), dk = static_cast<size_t>(s.dk), dv = static_cast<size_t>(s.dv);
  return C * (4 * dk + 2 * dv + 2 * C + 3);
}

int64_t chunk_len(const Shape& s, const Options& o) { return std::max<int64_t>(1, std::min(o.chunk, s.s)); }

}  // namespace

size_t cpu_forward_extra_bytes_bound(const Shape& s, const Options& o) {
  // chunk scratch + the running state when the caller does not take the final state
  return (chunk_floats(s, chunk_len(s, o)) + static_cast<size_t>(s.dk * s.dv)) * sizeof(float);
}

size_t cpu_backward_extra_bytes_bound(const Shape& s, const Options& o) {
  const int64_t c = chunk_len(s, o);
  const size_t chunks = static_cast<size_t>((s.s + c - 1) / c);
  const size_t state = static_cast<size_t>(s.dk * s.dv);
  // chunk scratch (boundary pass) + boundary states + the chunk's per-token states + dS + four dk vectors
  return (chunk_floats(s, c) + (std::max<size_t>(chunks, 1) + static_cast<size_t>(c) + 1) * state +
          4 * static_cast<size_t>(s.dk)) *
         sizeof(float);
}

void validate_conv(const Conv& c) {
  if (c.s < 0) bad("conv tokens s (" + n(c.s) + ") must be >= 0.");
  if (c.channels <= 0) bad("conv channels (" + n(c.channels) + ") must be >= 1.");
  if (c.kernel <= 0) bad("conv kernel size (" + n(c.kernel) + ") must be >= 1.");
}

}  // namespace lcplan::linear_attention
