// Internal to the two CPU implementations (streamed and naive): Eigen row-major aliases and bf16 -> fp32 staging.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/linear_ce/linear_ce.h"
#include "kernels/common/scratch_meter.h"

namespace lcplan::linear_ce::detail {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapC = Eigen::Map<const RowMat>;
using MapM = Eigen::Map<RowMat>;
using kernels::Scratch;
using kernels::ScratchMeter;

inline void to_f32(const bf16* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}
inline void from_f32(const float* src, bf16* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

// Rows [r0, r0 + rows) of a row-major [* x cols] input as fp32: a pointer into an fp32 input, or the bf16 rows
// converted into `buf` (which must hold rows * cols floats).
inline const float* rows_f32(DType t, const void* src, int64_t r0, int64_t rows, int64_t cols, float* buf) {
  if (t == DType::F32) return static_cast<const float*>(src) + r0 * cols;
  to_f32(static_cast<const bf16*>(src) + r0 * cols, buf, static_cast<size_t>(rows * cols));
  return buf;
}

// A whole input as fp32: the input itself, or (bf16) a converted copy charged to the meter. Only the naive
// baseline holds whole copies; the streamed path converts one tile at a time with rows_f32.
struct F32View {
  std::optional<Scratch<float>> copy;
  const float* ptr = nullptr;
  F32View(ScratchMeter& m, DType t, const void* src, int64_t rows, int64_t cols) {
    if (t == DType::BF16) copy.emplace(m, static_cast<size_t>(rows * cols));
    ptr = rows_f32(t, src, 0, rows, cols, copy ? copy->data() : nullptr);
  }
};

}  // namespace lcplan::linear_ce::detail
