// bf16: a 2-byte brain-float stored as uint16_t, converted with round-to-nearest-even on host and device.
// The one bf16 of the project: linear CE, the communicators and the MoE layer all use it.
// Layout-compatible with __nv_bfloat16 / CUDA_R_16BF, so device buffers of it can go straight to cuBLAS.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace lcplan {

struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2, "bf16 must stay 2 bytes to alias CUDA_R_16BF buffers");

LCPLAN_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

LCPLAN_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round-to-nearest-even on the 16 dropped mantissa bits; NaN stays a (quiet) NaN instead of rounding to inf.
LCPLAN_HD bf16 float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  const uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + bias) >> 16)};
}

LCPLAN_HD float bf16_to_float(bf16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

// Uniform load/store so templated tile code reads fp32 and bf16 inputs the same way.
LCPLAN_HD float to_float(float x) { return x; }
LCPLAN_HD float to_float(bf16 x) { return bf16_to_float(x); }
template <class T>
LCPLAN_HD T from_float(float x);
template <>
LCPLAN_HD float from_float<float>(float x) { return x; }
template <>
LCPLAN_HD bf16 from_float<bf16>(float x) { return float_to_bf16(x); }

// Rounds an fp32 value to the nearest bf16 and back: what storing it in a bf16 tensor does to it.
LCPLAN_HD float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Raw-bit forms for buffers typed as uint16_t (MPI reductions, NCCL/cuBLAS staging).
LCPLAN_HD float bf16_to_f32(uint16_t b) { return bf16_to_float(bf16{b}); }
LCPLAN_HD uint16_t f32_to_bf16(float f) { return float_to_bf16(f).bits; }

}  // namespace lcplan
