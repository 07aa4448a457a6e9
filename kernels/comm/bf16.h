// bf16 <-> fp32 conversions shared by host reductions and CUDA code (bf16 is stored as its uint16_t bits).
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace lcplan {

LCPLAN_HD float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as the hardware conversion does; NaN stays NaN (quiet).
LCPLAN_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace lcplan
