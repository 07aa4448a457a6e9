// Double-precision references, for tests only, written without linear_attention_math.h:
//  - the gated delta rule token by token, a line-by-line transcription of HF transformers'
//    torch_recurrent_gated_delta_rule (src/transformers/models/qwen3_next/modeling_qwen3_next.py), and an analytic
//    reverse pass that keeps every state and takes the normalisation's gradient as a projection,
//    dx = (dy - y (y . dy)) / ||x||_eps with y = x / ||x||_eps;
//  - the causal depthwise conv1d as a direct sum.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/linear_attention/linear_attention.h"

namespace lcplan::linear_attention {

namespace {

struct Normed {
  std::vector<double> y;  // normalised (and for q, scaled) vector
  double inv = 1.0;       // 1 / sqrt(sum x^2 + eps), 1 without normalisation
};

Normed normed(const double* x, int64_t n, const Options& o, double scale) {
  Normed r;
  if (o.qk_l2norm) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    r.inv = 1.0 / std::sqrt(ss + double(o.l2norm_eps));
  }
  r.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r.y[i] = x[i] * r.inv * scale;
  return r;
}

double scale_of(const Shape& s, const Options& o) {
  return o.scale > 0.0f ? double(o.scale) : 1.0 / std::sqrt(double(s.dk));
}

}  // namespace

void forward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* g,
                       const double* beta, const double* state_in, double* o, double* state_out, const Options& opt) {
  validate(s, opt);
  const int64_t dk = s.dk, dv = s.dv, st = dk * dv;
  const double scale = scale_of(s, opt);
  for (int64_t h = 0; h < s.hv; ++h) {
    const int64_t hk = h / (s.hv / s.hk);
    std::vector<double> S(static_cast<size_t>(st), 0.0);
    if (state_in) S.assign(state_in + h * st, state_in + (h + 1) * st);
    for (int64_t t = 0; t < s.s; ++t) {
      const Normed kt = normed(k + (t * s.hk + hk) * dk, dk, opt, 1.0);
      const Normed qt = normed(q + (t * s.hk + hk) * dk, dk, opt, scale);
      const double gt = std::exp(g[t * s.hv + h]), bt = beta[t * s.hv + h];
      for (auto& x : S) x *= gt;                                  // last_recurrent_state * g_t
      for (int64_t j = 0; j < dv; ++j) {
        double kv_mem = 0;                                        // (state * k_t.unsqueeze(-1)).sum(-2)
        for (int64_t i = 0; i < dk; ++i) kv_mem += S[i * dv + j] * kt.y[i];
        const double delta = (v[(t * s.hv + h) * dv + j] - kv_mem) * bt;
        for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += kt.y[i] * delta;  // + k_t.unsqueeze(-1) * delta
      }
      for (int64_t j = 0; j < dv; ++j) {
        double acc = 0;                                           // (state * q_t.unsqueeze(-1)).sum(-2)
        for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * qt.y[i];
        o[(t * s.hv + h) * dv + j] = acc;
      }
    }
    if (state_out) std::copy(S.begin(), S.end(), state_out + h * st);
  }
}

void backward_reference(const Shape& s, const double* q, const double* k, const double* v, const double* g,
                        const double* beta, const double* state_in, const double* d_o, const double* d_state_out,
                        double* dq, double* dk, double* dv, double* dg, double* dbeta, double* d_state_in,
                        const Options& opt) {
  validate(s, opt);
  const int64_t Dk = s.dk, Dv = s.dv, st = Dk * Dv, T = s.s;
  const double scale = scale_of(s, opt);
  std::fill(dq, dq + T * s.hk * Dk, 0.0);
  std::fill(dk, dk + T * s.hk * Dk, 0.0);
  for (int64_t h = 0; h < s.hv; ++h) {
    const int64_t hk = h / (s.hv / s.hk);
    // Forward, keeping S_0 .. S_T.
    std::vector<std::vector<double>> S(static_cast<size_t>(T + 1), std::vector<double>(static_cast<size_t>(st), 0.0));
    if (state_in) S[0].assign(state_in + h * st, state_in + (h + 1) * st);
    std::vector<Normed> kn(static_cast<size_t>(T)), qn(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      kn[t] = normed(k + (t * s.hk + hk) * Dk, Dk, opt, 1.0);
      qn[t] = normed(q + (t * s.hk + hk) * Dk, Dk, opt, scale);
      const double a = std::exp(g[t * s.hv + h]), b = beta[t * s.hv + h];
      S[t + 1] = S[t];
      for (auto& x : S[t + 1]) x *= a;
      for (int64_t j = 0; j < Dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < Dk; ++i) kv += S[t + 1][i * Dv + j] * kn[t].y[i];
        const double delta = b * (v[(t * s.hv + h) * Dv + j] - kv);
        for (int64_t i = 0; i < Dk; ++i) S[t + 1][i * Dv + j] += kn[t].y[i] * delta;
      }
    }
    // Reverse.
    std::vector<double> dS(static_cast<size_t>(st), 0.0);
    if (d_state_out) dS.assign(d_state_out + h * st, d_state_out + (h + 1) * st);
    std::vector<double> Sp(static_cast<size_t>(st)), kv(static_cast<size_t>(Dv)), delta(static_cast<size_t>(Dv)), dd(static_cast<size_t>(Dv)), dqh(static_cast<size_t>(Dk)),
        dkh(static_cast<size_t>(Dk));
    for (int64_t t = T - 1; t >= 0; --t) {
      const double a = std::exp(g[t * s.hv + h]), b = beta[t * s.hv + h];
      const double* vt = v + (t * s.hv + h) * Dv;
      const double* dot = d_o + (t * s.hv + h) * Dv;
      for (int64_t e = 0; e < st; ++e) Sp[e] = a * S[t][e];
      for (int64_t j = 0; j < Dv; ++j) {
        kv[j] = 0;
        for (int64_t i = 0; i < Dk; ++i) kv[j] += Sp[i * Dv + j] * kn[t].y[i];
        delta[j] = b * (vt[j] - kv[j]);
      }
      // o_t = S_t^T q_t
      for (int64_t i = 0; i < Dk; ++i) {
        dqh[i] = 0;
        for (int64_t j = 0; j < Dv; ++j) dqh[i] += S[t + 1][i * Dv + j] * dot[j];
      }
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) dS[i * Dv + j] += qn[t].y[i] * dot[j];
      // S_t = Sp + k delta^T
      double db = 0;
      for (int64_t j = 0; j < Dv; ++j) {
        dd[j] = 0;
        for (int64_t i = 0; i < Dk; ++i) dd[j] += dS[i * Dv + j] * kn[t].y[i];
        dv[(t * s.hv + h) * Dv + j] = b * dd[j];
        db += dd[j] * (vt[j] - kv[j]);
      }
      dbeta[t * s.hv + h] = db;
      for (int64_t i = 0; i < Dk; ++i) {
        dkh[i] = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          const double dkv = -b * dd[j];  // delta = b (v - Sp^T k)
          dkh[i] += dS[i * Dv + j] * delta[j] + Sp[i * Dv + j] * dkv;
        }
      }
      // dSp = dS + k dkv^T, then through Sp = a S_{t-1}
      double dga = 0;
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) {
          const double dsp = dS[i * Dv + j] + kn[t].y[i] * (-b * dd[j]);
          dga += dsp * S[t][i * Dv + j];
          dS[i * Dv + j] = a * dsp;
        }
      dg[t * s.hv + h] = dga * a;  // d a / d g = a
      // Back through y = x * inv (* scale for q).
      const double* qr = q + (t * s.hk + hk) * Dk;
      const double* kr = k + (t * s.hk + hk) * Dk;
      double yq = 0, yk = 0;  // y . dy with y the unscaled normalised vector
      for (int64_t i = 0; i < Dk; ++i) yq += qr[i] * qn[t].inv * dqh[i], yk += kr[i] * kn[t].inv * dkh[i];
      for (int64_t i = 0; i < Dk; ++i) {
        if (opt.qk_l2norm) {
          dq[(t * s.hk + hk) * Dk + i] += scale * qn[t].inv * (dqh[i] - qr[i] * qn[t].inv * yq);
          dk[(t * s.hk + hk) * Dk + i] += kn[t].inv * (dkh[i] - kr[i] * kn[t].inv * yk);
        } else {
          dq[(t * s.hk + hk) * Dk + i] += scale * dqh[i];
          dk[(t * s.hk + hk) * Dk + i] += dkh[i];
        }
      }
    }
    if (d_state_in) std::copy(dS.begin(), dS.end(), d_state_in + h * st);
  }
}

void conv1d_forward_reference(const Conv& c, const double* x, const double* history, const double* weight,
                              const double* bias, double* y) {
  validate_conv(c);
  const int64_t C = c.channels, K = c.kernel;
  for (int64_t t = 0; t < c.s; ++t)
    for (int64_t ch = 0; ch < C; ++ch) {
      double z = bias ? bias[ch] : 0.0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const int64_t u = t - (K - 1) + kk;
        const double xin = u >= 0 ? x[u * C + ch] : (history ? history[(u + K - 1) * C + ch] : 0.0);
        z += weight[ch * K + kk] * xin;
      }
      y[t * C + ch] = c.silu ? z / (1.0 + std::exp(-z)) : z;
    }
}

}  // namespace lcplan::linear_attention
