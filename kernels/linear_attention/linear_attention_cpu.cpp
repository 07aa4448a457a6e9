// CPU gated delta rule: chunked forward (UT transform inside a chunk, Eigen fp32 GEMMs, the state recurrence across
// chunks), backward by recomputing chunk-boundary states and running the recurrence in reverse per chunk
// (column_forward / column_backward of linear_attention_math.h, the code the CUDA kernels run); causal conv1d.
#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/scratch_meter.h"
#include "kernels/linear_attention/linear_attention.h"

namespace lcplan::linear_attention {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using CMapS = Eigen::Map<const RowMat, 0, Stride>;
using MapS = Eigen::Map<RowMat, 0, Stride>;
using TileMap = Eigen::Map<RowMat>;

using kernels::Scratch;
using kernels::ScratchMeter;

void need(const void* p, const char* name) {
  if (p == nullptr)
    throw std::invalid_argument(std::string("linear_attention: ") + name + " is null but the shape is not empty.");
}

// Scratch of one chunk step, sized for chunks of up to c tokens (linear_attention_common.cpp: chunk_floats).
struct ChunkScratch {
  ChunkScratch(ScratchMeter& m, const Shape& s, int64_t c)
      : kn(m, size_t(c * s.dk)), qn(m, size_t(c * s.dk)), kb(m, size_t(c * s.dk)), w(m, size_t(c * s.dk)),
        vb(m, size_t(c * s.dv)), u(m, size_t(c * s.dv)), a(m, size_t(c * c)), qk(m, size_t(c * c)),
        gam(m, size_t(c)), eg(m, size_t(c)), bt(m, size_t(c)) {}
  Scratch<float> kn, qn, kb, w, vb, u, a, qk, gam, eg, bt;
};

// Row t of head `head` of a [S x H x d] tensor, normalised (when asked) and scaled into dst; returns 1/norm (1 when
// not normalising).
float load_row(const float* src, int64_t t, int64_t heads, int64_t head, int64_t d, bool l2, float eps, float scale,
               float* dst) {
  const float* x = src + (t * heads + head) * d;
  const float inv = l2 ? l2norm_inv(x, d, eps) : 1.0f;
  for (int64_t i = 0; i < d; ++i) dst[i] = x[i] * inv * scale;
  return inv;
}

// Advances the row-major [dk x dv] `state` of value head h over tokens [t0, t0 + L); writes o rows when o != null.
void chunk_step(const Shape& s, int64_t h, int64_t t0, int64_t L, const float* q, const float* k, const float* v,
                const float* g, const float* beta, float* state, float* o, const Options& opt, float scale,
                ChunkScratch& x) {
  const int64_t hk = h / (s.hv / s.hk), dk = s.dk, dv = s.dv;
  TileMap Kn(x.kn.data(), L, dk), Qn(x.qn.data(), L, dk), Kb(x.kb.data(), L, dk), W(x.w.data(), L, dk);
  TileMap Vb(x.vb.data(), L, dv), U(x.u.data(), L, dv), A(x.a.data(), L, L), QK(x.qk.data(), L, L);
  TileMap S(state, dk, dv);
  const CMapS V(v + (t0 * s.hv + h) * dv, L, dv, Stride(s.hv * dv));
  float acc = 0.0f;
  for (int64_t r = 0; r < L; ++r) {
    const int64_t t = t0 + r;
    load_row(k, t, s.hk, hk, dk, opt.qk_l2norm, opt.l2norm_eps, 1.0f, x.kn.data() + r * dk);
    if (o != nullptr) load_row(q, t, s.hk, hk, dk, opt.qk_l2norm, opt.l2norm_eps, scale, x.qn.data() + r * dk);
    acc += g[t * s.hv + h];
    x.gam[r] = acc;
    x.eg[r] = decay_of(acc);
    x.bt[r] = beta[t * s.hv + h];
  }
  // T = (I - A)^{-1}, A[r][j] = -beta_r exp(G_r - G_j) k_r . k_j (j < r)
  A.noalias() = Kn * Kn.transpose();
  for (int64_t r = 0; r < L; ++r)
    for (int64_t j = 0; j < r; ++j) A(r, j) = ut_entry(x.bt[r], x.gam[r], x.gam[j], A(r, j));
  ut_transform(x.a.data(), L, L);
  for (int64_t r = 0; r < L; ++r) {
    Kb.row(r) = Kn.row(r) * (x.bt[r] * x.eg[r]);
    Vb.row(r) = V.row(r) * x.bt[r];
  }
  W.noalias() = A.triangularView<Eigen::Lower>() * Kb;
  U.noalias() = A.triangularView<Eigen::Lower>() * Vb;
  U.noalias() -= W * S;  // U now holds u, the per-token deltas
  if (o != nullptr) {
    QK.noalias() = Qn * Kn.transpose();
    for (int64_t r = 0; r < L; ++r) {
      for (int64_t j = 0; j <= r; ++j) QK(r, j) *= chunk_decay(x.gam[r], x.gam[j]);
      Qn.row(r) *= x.eg[r];
    }
    MapS O(o + (t0 * s.hv + h) * dv, L, dv, Stride(s.hv * dv));
    O.noalias() = Qn * S;
    O.noalias() += QK.triangularView<Eigen::Lower>() * U;
  }
  const float g_last = x.gam[L - 1];
  for (int64_t r = 0; r < L; ++r) Kb.row(r) = Kn.row(r) * chunk_decay(g_last, x.gam[r]);
  S *= x.eg[L - 1];
  S.noalias() += Kb.transpose() * U;
}

void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

}  // namespace

void forward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
                 const float* state_in, float* o, float* state_out, const Options& opt, Stats* stats) {
  validate(s, opt);
  if (stats) *stats = Stats{};
  const int64_t st = s.dk * s.dv;
  if (s.s > 0) need(q, "q"), need(k, "k"), need(v, "v"), need(g, "g"), need(beta, "beta"), need(o, "o");
  const float scale = resolved_scale(s, opt);
  const int64_t c = std::max<int64_t>(1, std::min(opt.chunk, s.s));
  ScratchMeter meter;
  {
    ChunkScratch x(meter, s, c);
    Scratch<float> local(meter, state_out == nullptr ? size_t(st) : 0);  // the running state when none is returned
    for (int64_t h = 0; h < s.hv; ++h) {
      float* state = state_out != nullptr ? state_out + h * st : local.data();
      if (state_in != nullptr) std::memmove(state, state_in + h * st, size_t(st) * sizeof(float));
      else std::fill_n(state, st, 0.0f);
      for (int64_t t0 = 0; t0 < s.s; t0 += c) chunk_step(s, h, t0, std::min(c, s.s - t0), q, k, v, g, beta, state, o, opt, scale, x);
    }
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

void backward_cpu(const Shape& s, const float* q, const float* k, const float* v, const float* g, const float* beta,
                  const float* state_in, const float* d_o, const float* d_state_out, float* dq, float* dk, float* dv,
                  float* dg, float* dbeta, float* d_state_in, const Options& opt, Stats* stats) {
  validate(s, opt);
  if (stats) *stats = Stats{};
  const int64_t dkk = s.dk, dvv = s.dv, st = dkk * dvv, group = s.hv / s.hk;
  if (s.s > 0) {
    need(q, "q"), need(k, "k"), need(v, "v"), need(g, "g"), need(beta, "beta"), need(d_o, "d_o");
    need(dq, "dq"), need(dk, "dk"), need(dv, "dv"), need(dg, "dg"), need(dbeta, "dbeta");
    std::fill_n(dq, s.s * s.hk * dkk, 0.0f);
    std::fill_n(dk, s.s * s.hk * dkk, 0.0f);
  }
  const float scale = resolved_scale(s, opt);
  const int64_t c = std::max<int64_t>(1, std::min(opt.chunk, s.s));
  const int64_t chunks = std::max<int64_t>(1, (s.s + c - 1) / c);
  ScratchMeter meter;
  {
    ChunkScratch x(meter, s, c);
    Scratch<float> bnd(meter, size_t(chunks * st));  // state entering chunk i, row-major [dk x dv]
    Scratch<float> cst(meter, size_t(c * st));       // S_{t-1} of each token of the chunk, transposed [dv x dk]
    Scratch<float> ds(meter, size_t(st));            // dS, transposed [dv x dk]
    Scratch<float> kn(meter, size_t(dkk)), qn(meter, size_t(dkk)), dqh(meter, size_t(dkk)), dkh(meter, size_t(dkk));
    for (int64_t h = 0; h < s.hv; ++h) {
      const int64_t hk = h / group;
      if (state_in != nullptr) std::memcpy(bnd.data(), state_in + h * st, size_t(st) * sizeof(float));
      else std::fill_n(bnd.data(), st, 0.0f);
      for (int64_t i = 0; i + 1 < chunks; ++i) {
        float* next = bnd.data() + (i + 1) * st;
        std::memcpy(next, bnd.data() + i * st, size_t(st) * sizeof(float));
        chunk_step(s, h, i * c, c, q, k, v, g, beta, next, nullptr, opt, scale, x);
      }
      if (d_state_out != nullptr) transpose(d_state_out + h * st, dkk, dvv, ds.data());
      else std::fill_n(ds.data(), st, 0.0f);
      for (int64_t i = chunks - 1; i >= 0; --i) {
        const int64_t t0 = i * c, L = std::min(c, s.s - t0);
        if (L <= 0) continue;  // s == 0
        transpose(bnd.data() + i * st, dkk, dvv, cst.data());
        for (int64_t r = 0; r + 1 < L; ++r) {
          const int64_t t = t0 + r;
          float* next = cst.data() + (r + 1) * st;
          std::memcpy(next, cst.data() + r * st, size_t(st) * sizeof(float));
          load_row(k, t, s.hk, hk, dkk, opt.qk_l2norm, opt.l2norm_eps, 1.0f, kn.data());
          const float a = decay_of(g[t * s.hv + h]), b = beta[t * s.hv + h];
          for (int64_t j = 0; j < dvv; ++j)
            column_forward(next + j * dkk, 1, kn.data(), nullptr, dkk, a, b, v[(t * s.hv + h) * dvv + j]);
        }
        for (int64_t r = L - 1; r >= 0; --r) {
          const int64_t t = t0 + r;
          const float inv_k = load_row(k, t, s.hk, hk, dkk, opt.qk_l2norm, opt.l2norm_eps, 1.0f, kn.data());
          const float inv_q = load_row(q, t, s.hk, hk, dkk, opt.qk_l2norm, opt.l2norm_eps, scale, qn.data());
          const float a = decay_of(g[t * s.hv + h]), b = beta[t * s.hv + h];
          std::fill_n(dqh.data(), dkk, 0.0f);
          std::fill_n(dkh.data(), dkk, 0.0f);
          float dbeta_acc = 0.0f, dg_acc = 0.0f;
          const float* sp = cst.data() + r * st;
          const float* vt = v + (t * s.hv + h) * dvv;
          const float* dot = d_o + (t * s.hv + h) * dvv;
          float* dvt = dv + (t * s.hv + h) * dvv;
          for (int64_t j = 0; j < dvv; ++j)
            column_backward(sp + j * dkk, ds.data() + j * dkk, 1, kn.data(), qn.data(), dkk, a, b, vt[j], dot[j],
                            dqh.data(), dkh.data(), dvt + j, &dbeta_acc, &dg_acc);
          dg[t * s.hv + h] = dg_acc;
          dbeta[t * s.hv + h] = dbeta_acc;
          // Through the scale and the normalisation back to the raw q and k (shared by the group's value heads).
          const float* qr = q + (t * s.hk + hk) * dkk;
          const float* kr = k + (t * s.hk + hk) * dkk;
          float* dqr = dq + (t * s.hk + hk) * dkk;
          float* dkr = dk + (t * s.hk + hk) * dkk;
          if (opt.qk_l2norm) {
            float xq = 0.0f, xk = 0.0f;
            for (int64_t e = 0; e < dkk; ++e) xq += qr[e] * dqh[e], xk += kr[e] * dkh[e];
            for (int64_t e = 0; e < dkk; ++e) {
              dqr[e] += scale * l2norm_grad(qr[e], dqh[e], inv_q, xq);
              dkr[e] += l2norm_grad(kr[e], dkh[e], inv_k, xk);
            }
          } else {
            for (int64_t e = 0; e < dkk; ++e) dqr[e] += scale * dqh[e], dkr[e] += dkh[e];
          }
        }
      }
      if (d_state_in != nullptr) transpose(ds.data(), dvv, dkk, d_state_in + h * st);
    }
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

// ---- causal depthwise conv1d ----

namespace {

void need_conv(const Conv& c, const float* x, const float* w) {
  validate_conv(c);
  if (c.s > 0) need(x, "conv input x");
  need(w, "conv weight");
}

}  // namespace

void conv1d_forward_cpu(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                        float* y) {
  need_conv(c, x, weight);
  if (c.s > 0) need(y, "conv output y");
  for (int64_t t = 0; t < c.s; ++t)
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      const float z = conv_pre(x, history, weight, bias, t, ch, c.channels, c.kernel);
      y[t * c.channels + ch] = c.silu ? silu(z) : z;
    }
}

void conv1d_backward_cpu(const Conv& c, const float* x, const float* history, const float* weight, const float* bias,
                         const float* dy, float* dx, float* d_history, float* d_weight, float* d_bias) {
  need_conv(c, x, weight);
  need(d_weight, "conv d_weight");
  const int64_t C = c.channels, K = c.kernel;
  if (c.s > 0) need(dy, "conv dy"), need(dx, "conv dx");
  std::fill_n(d_weight, C * K, 0.0f);
  if (d_bias != nullptr) std::fill_n(d_bias, C, 0.0f);
  if (d_history != nullptr) std::fill_n(d_history, (K - 1) * C, 0.0f);
  // Ring of the last K rows of the pre-activation gradient: input row u (u < 0: history) is complete once rows
  // u .. u + K - 1 of dpre exist, i.e. after row tt = u + K - 1.
  std::vector<float> ring(size_t(K * C));
  for (int64_t tt = 0; tt < c.s + K - 1; ++tt) {
    if (tt < c.s) {
      float* row = ring.data() + (tt % K) * C;
      for (int64_t ch = 0; ch < C; ++ch) {
        const float dyv = dy[tt * C + ch];
        const float z = c.silu ? conv_pre(x, history, weight, bias, tt, ch, C, K) : 0.0f;
        const float dz = c.silu ? dyv * silu_grad(z) : dyv;
        row[ch] = dz;
        for (int64_t kk = 0; kk < K; ++kk) d_weight[ch * K + kk] += dz * conv_input(x, history, tt - (K - 1) + kk, ch, C, K);
        if (d_bias != nullptr) d_bias[ch] += dz;
      }
    }
    const int64_t u = tt - (K - 1);
    float* out = u >= 0 ? dx + u * C : (d_history != nullptr ? d_history + (u + K - 1) * C : nullptr);
    if (out == nullptr) continue;
    for (int64_t ch = 0; ch < C; ++ch) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < K; ++kk) {
        const int64_t row = u + (K - 1) - kk;  // output row that read input u through tap kk
        if (row >= 0 && row < c.s) acc += weight[ch * K + kk] * ring[size_t((row % K) * C + ch)];
      }
      out[ch] = acc;
    }
  }
}

void conv1d_next_history(const Conv& c, const float* x, const float* history, float* next_history) {
  validate_conv(c);
  const int64_t C = c.channels, K = c.kernel;
  if (K == 1) return;
  need(next_history, "conv next_history");
  for (int64_t r = 0; r < K - 1; ++r) {
    const int64_t u = c.s - (K - 1) + r;  // extended index of the row
    for (int64_t ch = 0; ch < C; ++ch) next_history[r * C + ch] = conv_input(x, history, u, ch, C, K);
  }
}

}  // namespace lcplan::linear_attention
