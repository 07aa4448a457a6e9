#include "kernels/moe/cpu_gemm.h"

#include <algorithm>
#include <cstring>

namespace lcplan::moe::cpu {

namespace {

// Register tile: kR rows x kC columns of C kept in accumulators (4 x 8 fits the 16 SSE registers).
constexpr int kR = 4, kC = 8;

// Four lanes of float: lane-wise IEEE multiply and add, the same arithmetic as the scalar edge path.
typedef float v4 __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// C[i][j] (=|+=) sum_p X(i, p) * Y(p, j) over a kR x kC tile, p ascending; X(i, p) = X[i*xi + p*xp].
inline void tile(const float* X, int64_t xi, int64_t xp, const float* Y, int64_t ys, int64_t depth, float* C,
                 int64_t cs, bool load) {
  v4 acc[kR][2];
  for (int i = 0; i < kR; ++i)
    for (int h = 0; h < 2; ++h) acc[i][h] = load ? load4(C + i * cs + 4 * h) : v4{0, 0, 0, 0};
  for (int64_t p = 0; p < depth; ++p) {
    const v4 y0 = load4(Y + p * ys), y1 = load4(Y + p * ys + 4);
    for (int i = 0; i < kR; ++i) {
      const float x = X[i * xi + p * xp];
      const v4 xv = {x, x, x, x};
      acc[i][0] += xv * y0;
      acc[i][1] += xv * y1;
    }
  }
  for (int i = 0; i < kR; ++i)
    for (int h = 0; h < 2; ++h) std::memcpy(C + i * cs + 4 * h, &acc[i][h], sizeof(v4));
}

// The same arithmetic for edge tiles of any size (same start value, same p order, same single rounding per step).
inline void tile_any(const float* X, int64_t xi, int64_t xp, const float* Y, int64_t ys, int64_t depth, float* C,
                     int64_t cs, bool load, int r, int nc) {
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < nc; ++j) {
      float s = load ? C[i * cs + j] : 0.0f;
      for (int64_t p = 0; p < depth; ++p) s += X[i * xi + p * xp] * Y[p * ys + j];
      C[i * cs + j] = s;
    }
}

inline void any_tile(const float* X, int64_t xi, int64_t xp, const float* Y, int64_t ys, int64_t depth, float* C,
                     int64_t cs, bool load, int r, int nc) {
  if (r == kR && nc == kC) tile(X, xi, xp, Y, ys, depth, C, cs, load);
  else tile_any(X, xi, xp, Y, ys, depth, C, cs, load, r, nc);
}

}  // namespace

void gemm_nn(const float* A, const float* B, float* C, int64_t rows, int k, int n, bool accumulate) {
  // Blocks keep a kDepth x kC strip of B in L1 and a panel of A in L2. Later depth blocks resume from the partial
  // sums stored in C, so every element is still one ascending sum over p.
  constexpr int64_t kRowBlock = 64;
  constexpr int kDepth = 256;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t r1 = std::min(rows, r0 + kRowBlock);
    for (int p0 = 0; p0 < k; p0 += kDepth) {
      const int depth = std::min(kDepth, k - p0);
      for (int j0 = 0; j0 < n; j0 += kC)
        for (int64_t r = r0; r < r1; r += kR)
          any_tile(A + r * k + p0, k, 1, B + int64_t(p0) * n + j0, n, depth, C + r * n + j0, n, accumulate || p0 > 0,
                   int(std::min<int64_t>(kR, r1 - r)), std::min(kC, n - j0));
    }
  }
}

void transpose(const float* B, int n, int k, std::vector<float>& Bt) {
  Bt.resize(size_t(n) * k);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p) Bt[size_t(p) * n + i] = B[size_t(i) * k + p];
}

void gemm_tn_acc(const float* A, const float* D, float* G, int64_t rows, int k, int n) {
  constexpr int64_t kRowBlock = 256;  // rows of A and D kept in cache while every tile of G walks them
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t depth = std::min(kRowBlock, rows - r0);
    for (int i0 = 0; i0 < k; i0 += kR)
      for (int j0 = 0; j0 < n; j0 += kC)
        any_tile(A + r0 * k + i0, 1, k, D + r0 * n + j0, n, depth, G + int64_t(i0) * n + j0, n, true,
                 std::min(kR, k - i0), std::min(kC, n - j0));
  }
}


// C[rows x n] = A[rows x k] * B[k x n], in row blocks with a progress poll between them. cpu_gemm's fixed
// summation order makes each row's result independent of the blocking and of the chunk it belongs to.
void gemm_rows(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block) {
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    cpu::gemm_nn(A + r0 * k, B, C + r0 * n, std::min<int64_t>(block, rows - r0), k, n);
    if (poll) poll();
  }
}

// C[rows x n] = A[rows x k] * B[n x k]^T (dgrad through a weight stored k-major): B is transposed once.
void gemm_rows_bt(const float* A, const float* B, float* C, int64_t rows, int k, int n, const Poll& poll, int block) {
  if (rows == 0) return;
  std::vector<float> bt;
  cpu::transpose(B, n, k, bt);
  gemm_rows(A, bt.data(), C, rows, k, n, poll, block);
}

// G[k x n] += A[rows x k]^T * D[rows x n] (weight gradient), rows summed in ascending order; polls every block rows.
void gemm_at(const float* A, const float* D, float* G, int64_t rows, int k, int n, const Poll& poll,
             int block) {
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    cpu::gemm_tn_acc(A + r0 * k, D + r0 * n, G, std::min<int64_t>(block, rows - r0), k, n);
    if (poll) poll();
  }
}

}  // namespace lcplan::moe::cpu
