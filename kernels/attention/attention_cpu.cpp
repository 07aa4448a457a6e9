// CPU attention: FlashAttention-2 tiling (query tile x key tile, online softmax) with Eigen fp32 GEMMs per tile and
// the shared per-element math of attention_math.h; the log-sum-exp merge of partial results; RoPE.
#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/common/scratch_meter.h"

namespace lcplan::attention {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using CMapS = Eigen::Map<const RowMat, 0, Stride>;  // rows of one head inside a [tokens x heads x D] tensor
using MapS = Eigen::Map<RowMat, 0, Stride>;
using TileMap = Eigen::Map<RowMat>;

using kernels::Scratch;
using kernels::ScratchMeter;

void need(const void* p, const char* name) {
  if (p == nullptr) throw std::invalid_argument(std::string("attention: ") + name + " is null but the shape is not empty.");
}

}  // namespace

void forward_cpu(const Shape& s, const float* q, const float* k, const float* v, float* o, float* lse,
                 const Options& opt, Stats* stats) {
  validate(s, opt);
  if (stats) *stats = Stats{};
  if (s.sq == 0) return;
  need(q, "q"), need(o, "o"), need(lse, "lse");
  if (s.sk > 0) need(k, "k"), need(v, "v");
  const int64_t d = s.d, group = s.hq / s.hkv;
  const float scale = resolved_scale(s, opt);
  const int64_t bq = std::min(opt.q_tile, s.sq), bk = std::min(opt.k_tile, std::max<int64_t>(s.sk, 1));
  ScratchMeter meter;
  {
    Scratch<float> sc(meter, static_cast<size_t>(bq * bk)), acc(meter, static_cast<size_t>(bq * d));
    Scratch<float> m(meter, static_cast<size_t>(bq)), l(meter, static_cast<size_t>(bq)), alpha(meter, static_cast<size_t>(bq));
    const Stride q_stride(s.hq * d), kv_stride(s.hkv * d);
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t kh = h / group;
      for (int64_t i0 = 0; i0 < s.sq; i0 += bq) {
        const int64_t rows = std::min(bq, s.sq - i0);
        int64_t lo = 0, hi = 0, unused = 0;
        visible_key_range(opt.q_start + i0, opt.k_start, s.sk, opt.causal, opt.window, &lo, &unused);
        visible_key_range(opt.q_start + i0 + rows - 1, opt.k_start, s.sk, opt.causal, opt.window, &unused, &hi);
        std::fill_n(m.data(), rows, -INFINITY);
        std::fill_n(l.data(), rows, 0.0f);
        TileMap A(acc.data(), rows, d);
        A.setZero();
        const CMapS Q(q + (i0 * s.hq + h) * d, rows, d, q_stride);
        for (int64_t j0 = lo; j0 < hi; j0 += bk) {
          const int64_t cols = std::min(bk, hi - j0);
          const CMapS K(k + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
          const CMapS V(v + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
          TileMap S(sc.data(), rows, cols);
          S.noalias() = (scale * Q) * K.transpose();
          for (int64_t r = 0; r < rows; ++r) {
            float* row = sc.data() + r * cols;
            mask_row(row, cols, opt.q_start + i0 + r, opt.k_start + j0, opt.causal, opt.window);
            alpha[r] = online_softmax_row(row, cols, &m[r], &l[r]);
            if (alpha[r] != 1.0f) A.row(r) *= alpha[r];
          }
          A.noalias() += S * V;
        }
        MapS O(o + (i0 * s.hq + h) * d, rows, d, q_stride);
        for (int64_t r = 0; r < rows; ++r) {
          O.row(r) = A.row(r) * final_inv_l(l[r]);
          lse[h * s.sq + i0 + r] = final_lse(m[r], l[r]);
        }
      }
    }
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

void backward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* o, const float* lse,
                  const float* d_o, float* dq, float* dk, float* dv, const Options& opt, Stats* stats) {
  validate(s, opt);
  if (stats) *stats = Stats{};
  const int64_t d = s.d, group = s.hq / s.hkv;
  if (s.sq > 0) need(q, "q"), need(o, "o"), need(lse, "lse"), need(d_o, "d_o"), need(dq, "dq");
  if (s.sk > 0) need(k, "k"), need(v, "v"), need(dk, "dk"), need(dv, "dv");
  if (s.sq > 0) std::fill_n(dq, s.sq * s.hq * d, 0.0f);
  if (s.sk > 0) std::fill_n(dk, s.sk * s.hkv * d, 0.0f), std::fill_n(dv, s.sk * s.hkv * d, 0.0f);
  if (s.sq == 0 || s.sk == 0) return;
  const float scale = resolved_scale(s, opt);
  const int64_t bq = std::min(opt.q_tile, s.sq), bk = std::min(opt.k_tile, s.sk);
  ScratchMeter meter;
  {
    // D_i = rowsum(do_i * o_i), layout [Hq x Sq] like lse.
    Scratch<float> di(meter, static_cast<size_t>(s.hq * s.sq));
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        const float* a = d_o + (i * s.hq + h) * d;
        const float* b = o + (i * s.hq + h) * d;
        float acc = 0.0f;
        for (int64_t c = 0; c < d; ++c) acc += a[c] * b[c];
        di[h * s.sq + i] = acc;
      }
    Scratch<float> p(meter, static_cast<size_t>(bq * bk)), dp(meter, static_cast<size_t>(bq * bk));
    const Stride q_stride(s.hq * d), kv_stride(s.hkv * d);
    for (int64_t kh = 0; kh < s.hkv; ++kh) {
      for (int64_t j0 = 0; j0 < s.sk; j0 += bk) {
        const int64_t cols = std::min(bk, s.sk - j0);
        const int64_t kpos0 = opt.k_start + j0;
        const CMapS K(k + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
        const CMapS V(v + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
        MapS dK(dk + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
        MapS dV(dv + (j0 * s.hkv + kh) * d, cols, d, kv_stride);
        int64_t qlo = 0, qhi = 0;
        visible_query_range(kpos0, kpos0 + cols - 1, opt.q_start, s.sq, opt.causal, opt.window, &qlo, &qhi);
        for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
          for (int64_t i0 = qlo; i0 < qhi; i0 += bq) {
            const int64_t rows = std::min(bq, qhi - i0);
            const CMapS Q(q + (i0 * s.hq + h) * d, rows, d, q_stride);
            const CMapS dO(d_o + (i0 * s.hq + h) * d, rows, d, q_stride);
            MapS dQ(dq + (i0 * s.hq + h) * d, rows, d, q_stride);
            TileMap P(p.data(), rows, cols), dP(dp.data(), rows, cols);
            P.noalias() = (scale * Q) * K.transpose();
            for (int64_t r = 0; r < rows; ++r) {
              float* row = p.data() + r * cols;
              mask_row(row, cols, opt.q_start + i0 + r, kpos0, opt.causal, opt.window);
              const float row_lse = lse[h * s.sq + i0 + r];
              for (int64_t c = 0; c < cols; ++c) row[c] = prob_from_lse(row[c], row_lse);
            }
            dV.noalias() += P.transpose() * dO;
            dP.noalias() = dO * V.transpose();
            for (int64_t r = 0; r < rows; ++r) {
              const float dr = di[h * s.sq + i0 + r];
              float* pr = p.data() + r * cols;
              const float* dpr = dp.data() + r * cols;
              for (int64_t c = 0; c < cols; ++c) pr[c] = dscore(pr[c], dpr[c], dr);  // P now holds dS
            }
            dQ.noalias() += (scale * P) * K;
            dK.noalias() += (scale * P.transpose()) * Q;
          }
        }
      }
    }
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

void merge_partials(int64_t sq, int64_t hq, int64_t d, const float* o_a, const float* lse_a, const float* o_b,
                    const float* lse_b, float* o, float* lse) {
  if (sq < 0 || hq <= 0 || d <= 0)
    throw std::invalid_argument("attention: merge_partials needs sq >= 0, hq >= 1 and d >= 1 (got sq " +
                                std::to_string(sq) + ", hq " + std::to_string(hq) + ", d " + std::to_string(d) + ").");
  if (sq == 0) return;
  need(o_a, "o_a"), need(lse_a, "lse_a"), need(o_b, "o_b"), need(lse_b, "lse_b"), need(o, "o"), need(lse, "lse");
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t i = 0; i < sq; ++i) {
      const float la = lse_a[h * sq + i], lb = lse_b[h * sq + i];
      const float lt = lse_add(la, lb);
      const float wa = merge_weight(la, lt), wb = merge_weight(lb, lt);
      const int64_t off = (i * hq + h) * d;
      for (int64_t c = 0; c < d; ++c) o[off + c] = wa * o_a[off + c] + wb * o_b[off + c];
      lse[h * sq + i] = lt;
    }
}

namespace {

// Shared by forward (sign +1) and backward (sign -1, the inverse rotation).
void rope_apply(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o, float sign) {
  validate_rope(s, h, d, o);
  if (s == 0) return;
  need(x, "rope input"), need(y, "rope output");
  const int64_t r = o.rotary_dim < 0 ? d : o.rotary_dim, half = r / 2;
  std::vector<float> inv(static_cast<size_t>(half)), cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[i] = rope_inv_freq(i, r, o.theta);
  for (int64_t t = 0; t < s; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      rope_cos_sin(o.start + t, inv[i], &cs[i], &sn[i]);
      sn[i] *= sign;
    }
    for (int64_t hh = 0; hh < h; ++hh) {
      const float* a = x + (t * h + hh) * d;
      float* b = y + (t * h + hh) * d;
      for (int64_t i = 0; i < half; ++i) rope_rotate(a[i], a[i + half], cs[i], sn[i], &b[i], &b[i + half]);
      if (b != a) std::memcpy(b + r, a + r, static_cast<size_t>(d - r) * sizeof(float));
    }
  }
}

}  // namespace

void rope_forward_cpu(int64_t s, int64_t h, int64_t d, const float* x, float* y, const RopeOptions& o) {
  rope_apply(s, h, d, x, y, o, 1.0f);
}

void rope_backward_cpu(int64_t s, int64_t h, int64_t d, const float* dy, float* dx, const RopeOptions& o) {
  rope_apply(s, h, d, dy, dx, o, -1.0f);
}

}  // namespace lcplan::attention
