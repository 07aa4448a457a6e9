// Naive single-process MoE reference, token by token (no permutation, no communication): the tests' independent check.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/moe/moe_reference.h"

namespace lcplan::moe {

// Reference y = swiglu(x W1) W2 for one row of H values in T precision; keeps h1 (2f) and a (f) for a backward.
template <class T>
void reference_ffn_row(const T* xr, const float* W1, const float* W2, int H, int f, std::vector<T>& h1,
                       std::vector<T>& a, T* yr) {
  h1.assign(2 * f, T(0));
  a.assign(f, T(0));
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < 2 * f; ++j) h1[j] += xr[h] * T(W1[size_t(h) * 2 * f + j]);
  for (int j = 0; j < f; ++j) a[j] = swiglu(h1[j], h1[f + j]);
  for (int h = 0; h < H; ++h) yr[h] = 0;
  for (int j = 0; j < f; ++j)
    for (int h = 0; h < H; ++h) yr[h] += a[j] * T(W2[size_t(j) * H + h]);
}

template <class T>
void moe_reference_forward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens, T* out) {
  if (w.local_experts != c.experts) throw std::invalid_argument("the reference needs every expert on one rank");
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const RouterParams rp = router_params(c);
  std::vector<T> logits(E), scores(E), wk(K), bias(w.expert_bias.begin(), w.expert_bias.end()), h1, a, y(H);
  std::vector<int> idx(K);
  auto ffn = [&](const T* xr, const float* W1, const float* W2, int f, T* yr) {
    reference_ffn_row(xr, W1, W2, H, f, h1, a, yr);
  };
  for (int t = 0; t < tokens; ++t) {
    const T* xt = x + size_t(t) * H;
    T* ot = out + size_t(t) * H;
    for (int e = 0; e < E; ++e) {
      logits[e] = 0;
      for (int h = 0; h < H; ++h) logits[e] += xt[h] * T(w.router[size_t(h) * E + e]);
    }
    route_token(rp, logits.data(), c.router == Router::SigmoidGroupLimited ? bias.data() : nullptr, scores.data(),
                idx.data(), wk.data());
    for (int h = 0; h < H; ++h) ot[h] = 0;
    for (int k = 0; k < K; ++k) {
      ffn(xt, &w.w1[size_t(idx[k]) * H * 2 * F], &w.w2[size_t(idx[k]) * F * H], F, y.data());
      for (int h = 0; h < H; ++h) ot[h] += wk[k] * y[h];
    }
    if (S) {
      ffn(xt, w.shared_w1.data(), w.shared_w2.data(), S, y.data());
      T gt = 1;
      if (c.shared_gate) {
        T z = 0;
        for (int h = 0; h < H; ++h) z += xt[h] * T(w.shared_gate[h]);
        gt = sigmoid_(z);
      }
      for (int h = 0; h < H; ++h) ot[h] += gt * y[h];
    }
  }
}

template void moe_reference_forward<float>(const MoeConfig&, const MoeWeights&, const float*, int, float*);
template void moe_reference_forward<double>(const MoeConfig&, const MoeWeights&, const double*, int, double*);

template <class T>
ReferenceGrads<T> moe_reference_backward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens,
                                         const T* dout) {
  if (w.local_experts != c.experts) throw std::invalid_argument("the reference needs every expert on one rank");
  const int H = c.hidden, E = c.experts, K = c.top_k, F = c.expert_ffn, S = c.shared_ffn;
  const RouterParams rp = router_params(c);
  ReferenceGrads<T> g;
  g.dx.assign(size_t(tokens) * H, T(0));
  g.router.assign(w.router.size(), T(0));
  g.w1.assign(w.w1.size(), T(0));
  g.w2.assign(w.w2.size(), T(0));
  g.shared_w1.assign(w.shared_w1.size(), T(0));
  g.shared_w2.assign(w.shared_w2.size(), T(0));
  g.shared_gate.assign(w.shared_gate.size(), T(0));
  std::vector<T> logits(E), scores(E), wk(K), dwk(K), dlogits(E), bias(w.expert_bias.begin(), w.expert_bias.end());
  std::vector<T> h1, a, y(H), dy(H), da, dh1;
  std::vector<int> idx(K);
  auto ffn = [&](const T* xr, const float* W1, const float* W2, int f, T* yr) {
    reference_ffn_row(xr, W1, W2, H, f, h1, a, yr);
  };
  // Backward of the row just run through ffn: weight grads into gW1 / gW2, input grad added to dxr.
  auto ffn_bwd = [&](const T* xr, const float* W1, const float* W2, int f, const T* dyr, T* gW1, T* gW2, T* dxr) {
    da.assign(f, T(0));
    dh1.assign(2 * f, T(0));
    for (int j = 0; j < f; ++j)
      for (int h = 0; h < H; ++h) {
        gW2[size_t(j) * H + h] += a[j] * dyr[h];
        da[j] += dyr[h] * T(W2[size_t(j) * H + h]);
      }
    for (int j = 0; j < f; ++j) swiglu_bwd(h1[j], h1[f + j], da[j], &dh1[j], &dh1[f + j]);
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < 2 * f; ++j) {
        gW1[size_t(h) * 2 * f + j] += xr[h] * dh1[j];
        dxr[h] += dh1[j] * T(W1[size_t(h) * 2 * f + j]);
      }
  };
  for (int t = 0; t < tokens; ++t) {
    const T* xt = x + size_t(t) * H;
    const T* dt = dout + size_t(t) * H;
    T* dxt = g.dx.data() + size_t(t) * H;
    for (int e = 0; e < E; ++e) {
      logits[e] = 0;
      for (int h = 0; h < H; ++h) logits[e] += xt[h] * T(w.router[size_t(h) * E + e]);
    }
    route_token(rp, logits.data(), c.router == Router::SigmoidGroupLimited ? bias.data() : nullptr, scores.data(),
                idx.data(), wk.data());
    for (int k = 0; k < K; ++k) {  // out += w_k y_k: dw_k = <dout, y_k>, dy_k = w_k dout
      const size_t e = size_t(idx[k]);
      ffn(xt, &w.w1[e * H * 2 * F], &w.w2[e * F * H], F, y.data());
      dwk[k] = 0;
      for (int h = 0; h < H; ++h) {
        dwk[k] += dt[h] * y[h];
        dy[h] = wk[k] * dt[h];
      }
      ffn_bwd(xt, &w.w1[e * H * 2 * F], &w.w2[e * F * H], F, dy.data(), &g.w1[e * H * 2 * F], &g.w2[e * F * H], dxt);
    }
    if (S) {  // out += gate * ys
      ffn(xt, w.shared_w1.data(), w.shared_w2.data(), S, y.data());
      T gt = 1;
      if (c.shared_gate) {
        T z = 0;
        for (int h = 0; h < H; ++h) z += xt[h] * T(w.shared_gate[h]);
        gt = sigmoid_(z);
        T dz = 0;
        for (int h = 0; h < H; ++h) dz += dt[h] * y[h];
        dz *= gt * (T(1) - gt);
        for (int h = 0; h < H; ++h) {
          g.shared_gate[h] += dz * xt[h];
          dxt[h] += dz * T(w.shared_gate[h]);
        }
      }
      for (int h = 0; h < H; ++h) dy[h] = gt * dt[h];
      ffn_bwd(xt, w.shared_w1.data(), w.shared_w2.data(), S, dy.data(), g.shared_w1.data(), g.shared_w2.data(), dxt);
    }
    route_token_bwd(rp, scores.data(), idx.data(), dwk.data(), dlogits.data());
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < E; ++e) {
        g.router[size_t(h) * E + e] += xt[h] * dlogits[e];
        dxt[h] += dlogits[e] * T(w.router[size_t(h) * E + e]);
      }
  }
  return g;
}

template ReferenceGrads<double> moe_reference_backward<double>(const MoeConfig&, const MoeWeights&, const double*,
                                                               int, const double*);

}  // namespace lcplan::moe
