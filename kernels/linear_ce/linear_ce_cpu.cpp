// CPU linear cross-entropy: vocabulary tiles x token tiles, Eigen fp32 GEMMs, the shared LCPLAN_HD math per element.
// Loop order is vocab tile outer, token tile inner: each d_weight tile is complete when its vocab tile ends (so it
// needs only a [vocab_tile x H] accumulator), while d_hidden accumulates over vocab tiles in an [N x H] buffer.
#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "kernels/linear_ce/cpu_util.h"
#include "kernels/linear_ce/linear_ce.h"
#include "kernels/common/scratch_meter.h"

namespace lcplan::linear_ce {

namespace {

using detail::from_f32;
using detail::MapC;
using detail::MapM;
using detail::rows_f32;
using kernels::Scratch;
using kernels::ScratchMeter;

void check_pointers(const Problem& p, const void* hidden, const void* weight, const void* a, const void* b) {
  if (weight == nullptr || a == nullptr) throw std::invalid_argument("linear_ce: weight or an output pointer is null.");
  if (p.tokens > 0 && (hidden == nullptr || b == nullptr))
    throw std::invalid_argument("linear_ce: hidden or an output pointer is null while tokens > 0.");
}

// bf16 inputs are widened one tile at a time into these buffers (fp32 inputs are used in place): extra memory stays
// O(token_tile * H + vocab_tile * H) instead of an N x H copy of hidden.
struct TileBuffers {
  std::optional<Scratch<float>> e, w;
  TileBuffers(ScratchMeter& m, DType t, int64_t nt_max, int64_t vt_max, int64_t h) {
    if (t != DType::BF16) return;
    e.emplace(m, static_cast<size_t>(nt_max * h));
    w.emplace(m, static_cast<size_t>(vt_max * h));
  }
  float* ebuf() { return e ? e->data() : nullptr; }
  float* wbuf() { return w ? w->data() : nullptr; }
};

}  // namespace

void forward_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets, float* loss,
                 float* lse, const Options& o, Stats* stats, const CrossRankAllReduce& all_reduce) {
  validate(p, o);
  validate_shard(p, static_cast<bool>(all_reduce));
  validate_targets(p, o, targets);
  check_pointers(p, hidden, weight, loss, lse);
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  const int64_t nt_max = std::min<int64_t>(o.token_tile, std::max<int64_t>(n, 1));
  const int64_t vt_max = std::min<int64_t>(o.vocab_tile, v);
  const float cap = o.softcap;
  ScratchMeter meter;
  {
    Scratch<float> m(meter, n);
    Scratch<float> st(meter, 2 * n);  // s (sum-exp) then target logit, contiguous so one all-reduce sums both
    float* s = st.data();
    float* tl = st.data() + n;
    for (int64_t i = 0; i < n; ++i) {
      m[i] = -INFINITY;
      s[i] = 0.0f;
      tl[i] = 0.0f;
    }
    {
      TileBuffers bufs(meter, t, nt_max, vt_max, h);
      Scratch<float> logits(meter, static_cast<size_t>(nt_max * vt_max));
      for (int64_t v0 = 0; v0 < v; v0 += vt_max) {
        const int64_t vt = std::min(vt_max, v - v0);
        const int64_t g0 = p.vocab_start + v0;  // global id of this tile's first column
        MapC w(rows_f32(t, weight, v0, vt, h, bufs.wbuf()), vt, h);
        for (int64_t t0 = 0; t0 < n; t0 += nt_max) {
          const int64_t nt = std::min(nt_max, n - t0);
          MapM l(logits.data(), nt, vt);
          l.noalias() = MapC(rows_f32(t, hidden, t0, nt, h, bufs.ebuf()), nt, h) * w.transpose();
          for (int64_t r = 0; r < nt; ++r) {
            const int64_t i = t0 + r;
            float* row = logits.data() + r * vt;
            float mx = -INFINITY;
            for (int64_t c = 0; c < vt; ++c) {
              row[c] = softcap_apply(row[c], cap);
              mx = std::max(mx, row[c]);
            }
            float se = 0.0f;
            for (int64_t c = 0; c < vt; ++c) se += std::exp(row[c] - mx);
            const LseState merged = lse_merge(LseState{m[i], s[i]}, LseState{mx, se});
            m[i] = merged.m;
            s[i] = merged.s;
            const int64_t tg = targets[i];
            if (tg >= g0 && tg < g0 + vt) tl[i] = row[tg - g0];
          }
        }
      }
    }
    if (all_reduce) {
      // Max first so each rank can rescale its sum-exp to the common max; the target logit is owned by one rank.
      Scratch<float> mg(meter, n);
      std::copy(m.data(), m.data() + n, mg.data());
      all_reduce(mg.data(), static_cast<size_t>(n), CrossRankOp::Max);
      for (int64_t i = 0; i < n; ++i) {
        s[i] = lse_rescale(s[i], m[i], mg[i]);
        m[i] = mg[i];
      }
      all_reduce(st.data(), static_cast<size_t>(2 * n), CrossRankOp::Sum);
    }
    double total = 0.0;  // fp64 so the reduced loss does not depend on token count precision
    int64_t valid = 0;
    for (int64_t i = 0; i < n; ++i) {
      lse[i] = lse_value(LseState{m[i], s[i]});
      const bool ign = is_ignored(targets[i], o.ignore_index);
      const float li = ign ? 0.0f : token_loss(lse[i], tl[i], o.z_loss);
      valid += ign ? 0 : 1;
      if (o.reduction == Reduction::None) loss[i] = li;
      total += li;
    }
    if (o.reduction == Reduction::Sum) loss[0] = static_cast<float>(total);
    // Mean over zero valid tokens is defined as 0 (not NaN) so an all-padding micro-batch cannot poison a step.
    if (o.reduction == Reduction::Mean) loss[0] = valid > 0 ? static_cast<float>(total / valid) : 0.0f;
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

void backward_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                  const float* lse, const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                  Stats* stats, const CrossRankAllReduce& all_reduce) {
  validate(p, o);
  validate_shard(p, static_cast<bool>(all_reduce));
  validate_targets(p, o, targets);
  check_pointers(p, hidden, weight, d_weight, d_hidden);
  if (grad_loss == nullptr || (p.tokens > 0 && lse == nullptr))
    throw std::invalid_argument("linear_ce: grad_loss or lse is null.");
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  const int64_t nt_max = std::min<int64_t>(o.token_tile, std::max<int64_t>(n, 1));
  const int64_t vt_max = std::min<int64_t>(o.vocab_tile, v);
  const bool b16 = t == DType::BF16;
  ScratchMeter meter;
  {
    const int64_t n_valid = count_valid(targets, n, o.ignore_index);
    Scratch<float> g(meter, n);
    for (int64_t i = 0; i < n; ++i)
      g[i] = upstream_grad(o.reduction, is_ignored(targets[i], o.ignore_index), grad_loss, i, n_valid);

    TileBuffers bufs(meter, t, nt_max, vt_max, h);
    // fp32 outputs are their own accumulators. bf16 outputs get fp32 ones, rounded once at the end: a [vocab_tile x H]
    // tile for d_weight, but all of [N x H] for d_hidden, which sums over every vocabulary tile (the output's own
    // precision would otherwise round ceil(V / vocab_tile) times).
    std::optional<Scratch<float>> de_buf, dw_buf;
    if (b16) {
      de_buf.emplace(meter, static_cast<size_t>(n * h), true);
      dw_buf.emplace(meter, static_cast<size_t>(vt_max * h));
    } else {
      std::fill_n(static_cast<float*>(d_hidden), n * h, 0.0f);
    }
    float* de = b16 ? de_buf->data() : static_cast<float*>(d_hidden);
    Scratch<float> logits(meter, static_cast<size_t>(nt_max * vt_max));

    for (int64_t v0 = 0; v0 < v; v0 += vt_max) {
      const int64_t vt = std::min(vt_max, v - v0);
      const int64_t g0 = p.vocab_start + v0;
      MapC w(rows_f32(t, weight, v0, vt, h, bufs.wbuf()), vt, h);
      float* dw_ptr = b16 ? dw_buf->data() : static_cast<float*>(d_weight) + v0 * h;
      MapM dw(dw_ptr, vt, h);
      dw.setZero();
      for (int64_t t0 = 0; t0 < n; t0 += nt_max) {
        const int64_t nt = std::min(nt_max, n - t0);
        // A token tile whose rows all have zero upstream gradient (ignored) contributes exactly nothing.
        if (std::all_of(g.data() + t0, g.data() + t0 + nt, [](float x) { return x == 0.0f; })) continue;
        MapM l(logits.data(), nt, vt);
        MapC et(rows_f32(t, hidden, t0, nt, h, bufs.ebuf()), nt, h);
        l.noalias() = et * w.transpose();
        for (int64_t r = 0; r < nt; ++r) {
          const int64_t i = t0 + r;
          float* row = logits.data() + r * vt;
          if (g[i] == 0.0f) {
            std::fill_n(row, vt, 0.0f);
            continue;
          }
          const int64_t local_target = targets[i] - g0;  // may fall outside this tile
          for (int64_t c = 0; c < vt; ++c)
            row[c] = logit_grad(softcap_apply(row[c], o.softcap), lse[i], c == local_target, g[i], o.z_loss,
                                o.softcap);
        }
        dw.noalias() += l.transpose() * et;
        MapM(de + t0 * h, nt, h).noalias() += l * w;
      }
      if (b16) from_f32(dw_buf->data(), static_cast<bf16*>(d_weight) + v0 * h, static_cast<size_t>(vt * h));
    }
    // Each rank saw only its vocabulary rows: the full d_hidden is the sum of the partial ones, taken in fp32.
    if (all_reduce) all_reduce(de, static_cast<size_t>(n * h), CrossRankOp::Sum);
    if (b16) from_f32(de, static_cast<bf16*>(d_hidden), static_cast<size_t>(n * h));
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

}  // namespace lcplan::linear_ce
