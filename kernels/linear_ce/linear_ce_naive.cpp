// Paired baseline: the materialised-logits cross-entropy a framework runs, [N x V] logits in memory at once.
// With bf16 inputs it rounds the logits and their gradient to bf16, as a bf16 matmul output and autograd would.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/linear_ce/cpu_util.h"
#include "kernels/linear_ce/linear_ce.h"
#include "kernels/common/scratch_meter.h"

namespace lcplan::linear_ce {

namespace {

using detail::F32View;
using detail::MapC;
using detail::MapM;
using kernels::Scratch;
using kernels::ScratchMeter;

void check_single_rank(const Problem& p) {
  if (p.vocab_start != 0 || (p.vocab_total >= 0 && p.vocab_total != p.vocab))
    throw std::invalid_argument("linear_ce: the naive baseline runs on a single rank holding the whole vocabulary.");
}

// Full logits [N x V], soft-capped, rounded to bf16 when the inputs are bf16.
void logits_full(const Problem& p, DType t, const float* e, const float* w, float cap, float* out) {
  MapM l(out, p.tokens, p.vocab);
  l.noalias() = MapC(e, p.tokens, p.hidden) * MapC(w, p.vocab, p.hidden).transpose();
  const size_t total = static_cast<size_t>(p.tokens * p.vocab);
  for (size_t k = 0; k < total; ++k) {
    float x = t == DType::BF16 ? round_bf16(out[k]) : out[k];
    out[k] = softcap_apply(x, cap);
  }
}

}  // namespace

void forward_naive_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                       float* loss, float* lse, const Options& o, Stats* stats) {
  validate(p, o);
  check_single_rank(p);
  validate_targets(p, o, targets);
  if (weight == nullptr || loss == nullptr || (p.tokens > 0 && (hidden == nullptr || lse == nullptr)))
    throw std::invalid_argument("linear_ce: a null pointer was passed to the naive forward.");
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  ScratchMeter meter;
  {
    F32View e(meter, t, hidden, n, h);
    F32View w(meter, t, weight, v, h);
    Scratch<float> logits(meter, static_cast<size_t>(n * v));
    logits_full(p, t, e.ptr, w.ptr, o.softcap, logits.data());
    double total = 0.0;
    int64_t valid = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * v;
      const float mx = *std::max_element(row, row + v);
      float se = 0.0f;
      for (int64_t c = 0; c < v; ++c) se += std::exp(row[c] - mx);
      lse[i] = mx + std::log(se);
      const bool ign = is_ignored(targets[i], o.ignore_index);
      const float li = ign ? 0.0f : token_loss(lse[i], row[targets[i]], o.z_loss);
      valid += ign ? 0 : 1;
      if (o.reduction == Reduction::None) loss[i] = li;
      total += li;
    }
    if (o.reduction == Reduction::Sum) loss[0] = static_cast<float>(total);
    if (o.reduction == Reduction::Mean) loss[0] = valid > 0 ? static_cast<float>(total / valid) : 0.0f;
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

void backward_naive_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                        const float* lse, const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                        Stats* stats) {
  validate(p, o);
  check_single_rank(p);
  validate_targets(p, o, targets);
  if (weight == nullptr || d_weight == nullptr || grad_loss == nullptr ||
      (p.tokens > 0 && (hidden == nullptr || d_hidden == nullptr || lse == nullptr)))
    throw std::invalid_argument("linear_ce: a null pointer was passed to the naive backward.");
  const int64_t n = p.tokens, h = p.hidden, v = p.vocab;
  const bool b16 = t == DType::BF16;
  ScratchMeter meter;
  {
    F32View e(meter, t, hidden, n, h);
    F32View w(meter, t, weight, v, h);
    Scratch<float> d(meter, static_cast<size_t>(n * v));
    logits_full(p, t, e.ptr, w.ptr, o.softcap, d.data());
    const int64_t n_valid = count_valid(targets, n, o.ignore_index);
    for (int64_t i = 0; i < n; ++i) {
      const float g = upstream_grad(o.reduction, is_ignored(targets[i], o.ignore_index), grad_loss, i, n_valid);
      float* row = d.data() + i * v;
      for (int64_t c = 0; c < v; ++c) {
        const float x = g == 0.0f ? 0.0f : logit_grad(row[c], lse[i], c == targets[i], g, o.z_loss, o.softcap);
        row[c] = b16 ? round_bf16(x) : x;
      }
    }
    MapC dl(d.data(), n, v);
    if (!b16) {
      MapM(static_cast<float*>(d_hidden), n, h).noalias() = dl * MapC(w.ptr, v, h);
      MapM(static_cast<float*>(d_weight), v, h).noalias() = dl.transpose() * MapC(e.ptr, n, h);
    } else {
      Scratch<float> de(meter, static_cast<size_t>(n * h));
      MapM(de.data(), n, h).noalias() = dl * MapC(w.ptr, v, h);
      detail::from_f32(de.data(), static_cast<bf16*>(d_hidden), static_cast<size_t>(n * h));
      Scratch<float> dw(meter, static_cast<size_t>(v * h));
      MapM(dw.data(), v, h).noalias() = dl.transpose() * MapC(e.ptr, n, h);
      detail::from_f32(dw.data(), static_cast<bf16*>(d_weight), static_cast<size_t>(v * h));
    }
  }
  if (stats) stats->peak_extra_bytes = meter.peak();
}

}  // namespace lcplan::linear_ce
