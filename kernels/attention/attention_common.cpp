// Validation, scale, visible-pair count and memory bounds shared by the CPU, reference and CUDA paths.
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/attention/attention.h"

namespace lcplan::attention {

namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("attention: " + what); }

std::string n(int64_t x) { return std::to_string(x); }

}  // namespace

void validate(const Shape& s, const Options& o) {
  if (s.sq < 0) bad("sq (" + n(s.sq) + ") must be >= 0.");
  if (s.sk < 0) bad("sk (" + n(s.sk) + ") must be >= 0.");
  if (s.hkv <= 0) bad("hkv (" + n(s.hkv) + ") must be >= 1.");
  if (s.hq <= 0 || s.hq % s.hkv != 0) bad("hq (" + n(s.hq) + ") must be a positive multiple of hkv (" + n(s.hkv) + ").");
  if (s.d <= 0) bad("head dim d (" + n(s.d) + ") must be >= 1.");
  if (o.window < 0) bad("window (" + n(o.window) + ") must be >= 0 (0 disables the sliding window).");
  if (!(o.scale >= 0.0f) || !std::isfinite(o.scale))
    bad("scale (" + std::to_string(o.scale) + ") must be a finite value > 0, or 0 for 1/sqrt(d).");
  if (o.q_tile <= 0) bad("q_tile (" + n(o.q_tile) + ") must be >= 1.");
  if (o.k_tile <= 0) bad("k_tile (" + n(o.k_tile) + ") must be >= 1.");
}

float resolved_scale(const Shape& s, const Options& o) {
  return o.scale > 0.0f ? o.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
}

double visible_pairs(const Shape& s, const Options& o) {
  double total = 0;
  for (int64_t i = 0; i < s.sq; ++i) {
    int64_t lo = 0, hi = 0;
    visible_key_range(o.q_start + i, o.k_start, s.sk, o.causal, o.window, &lo, &hi);
    total += static_cast<double>(hi - lo);
  }
  return total;
}

size_t cpu_forward_extra_bytes_bound(const Shape& s, const Options& o) {
  const size_t bq = static_cast<size_t>(o.q_tile), bk = static_cast<size_t>(o.k_tile), d = static_cast<size_t>(s.d);
  // score tile, output accumulator, running max / sum / rescale factor per row
  return (bq * bk + bq * d + 3 * bq) * sizeof(float);
}

size_t cpu_backward_extra_bytes_bound(const Shape& s, const Options& o) {
  const size_t bq = static_cast<size_t>(o.q_tile), bk = static_cast<size_t>(o.k_tile);
  // D_i for every (head, query) plus the probability and dp tiles
  return (static_cast<size_t>(s.hq) * static_cast<size_t>(s.sq) + 2 * bq * bk) * sizeof(float);
}

void validate_rope(int64_t s, int64_t h, int64_t d, const RopeOptions& o) {
  if (s < 0) bad("rope tokens (" + n(s) + ") must be >= 0.");
  if (h <= 0) bad("rope heads (" + n(h) + ") must be >= 1.");
  if (d <= 0) bad("rope head dim (" + n(d) + ") must be >= 1.");
  const int64_t r = o.rotary_dim < 0 ? d : o.rotary_dim;
  if (r <= 0 || r > d || r % 2 != 0)
    bad("rotary_dim (" + n(o.rotary_dim) + ") must be even and in [2, " + n(d) + "], or -1 for the whole head dim.");
  if (!(o.theta > 1.0f) || !std::isfinite(o.theta)) bad("rope theta (" + std::to_string(o.theta) + ") must be finite and > 1.");
  if (o.start < 0) bad("rope start (" + n(o.start) + ") must be >= 0.");
}

}  // namespace lcplan::attention
