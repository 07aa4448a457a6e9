// Deterministic MoE weights and the layer's configuration checks (shared by the CPU and GPU layers and the tests).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/moe/moe_layer.h"

namespace lcplan::moe {

namespace {

// Counter-based generator: a weight's value depends only on (seed, tensor, index), never on call order.
float hash_uniform(uint64_t seed, uint64_t tensor, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + tensor * 0xD1B54A32D192ED03ull + i * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;  // [-1, 1)
}

void fill(std::vector<float>& v, size_t n, uint64_t seed, uint64_t tensor, uint64_t first, float scale) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * hash_uniform(seed, tensor, first + i);
}

}  // namespace

RouterParams router_params(const MoeConfig& c) {
  RouterParams p;
  p.kind = c.router;
  p.experts = c.experts;
  p.top_k = c.top_k;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.normalize = c.normalize;
  p.scale = c.scale;
  return p;
}

std::string moe_config_error(const MoeConfig& c, int ep_size) {
  auto s = [](long v) { return std::to_string(v); };
  if (c.hidden < 1 || c.experts < 1 || c.top_k < 1 || c.expert_ffn < 1)
    return "MoE config needs positive hidden, experts, top_k and expert_ffn (got " + s(c.hidden) + ", " +
           s(c.experts) + ", " + s(c.top_k) + ", " + s(c.expert_ffn) + ")";
  if (c.experts % ep_size != 0)
    return "experts = " + s(c.experts) + " is not divisible by EP = " + s(ep_size) +
           "; choose an EP size that divides the expert count";
  if (c.top_k > c.experts) return "top_k = " + s(c.top_k) + " exceeds experts = " + s(c.experts);
  if (c.router == Router::SigmoidGroupLimited) {
    if (c.n_group < 1 || c.n_group > kMaxGroups || c.experts % c.n_group != 0)
      return "n_group = " + s(c.n_group) + " must divide experts = " + s(c.experts) + " and be at most 64";
    if (c.topk_group < 1 || c.topk_group > c.n_group)
      return "topk_group = " + s(c.topk_group) + " must be between 1 and n_group = " + s(c.n_group);
    if (c.top_k > c.topk_group * (c.experts / c.n_group))
      return "top_k = " + s(c.top_k) + " exceeds the " + s(c.topk_group * (c.experts / c.n_group)) +
             " experts in the kept groups";
  }
  return "";
}

MoeWeights make_weights(const MoeConfig& c, int ep_rank, int ep_size, uint64_t seed, int etp_rank, int etp_size) {
  std::string err = moe_config_error(c, ep_size);
  if (err.empty() && (etp_size < 1 || c.expert_ffn % etp_size != 0 || etp_rank < 0 || etp_rank >= etp_size))
    err = "expert_ffn = " + std::to_string(c.expert_ffn) + " is not divisible by ETP = " + std::to_string(etp_size) +
          " (or ETP rank " + std::to_string(etp_rank) + " is out of range); choose an ETP size that divides it";
  if (!err.empty()) throw std::invalid_argument(err);
  const size_t H = c.hidden, E = c.experts, F = c.expert_ffn, S = c.shared_ffn;
  MoeWeights w;
  w.local_experts = c.experts / ep_size;
  w.first_expert = ep_rank * w.local_experts;
  const float sh = 1.0f / std::sqrt(float(H)), sf = 1.0f / std::sqrt(float(F));
  fill(w.router, H * E, seed, 1, 0, sh);
  fill(w.expert_bias, E, seed, 2, 0, c.router == Router::SigmoidGroupLimited ? 0.1f : 0.0f);
  const size_t n1 = H * 2 * F, n2 = F * H;
  fill(w.w1, w.local_experts * n1, seed, 3, w.first_expert * n1, sh);
  fill(w.w2, w.local_experts * n2, seed, 4, w.first_expert * n2, sf);
  if (etp_size > 1) {
    // This ETP rank's columns of each expert: [gate | up] halves of w1, the matching rows of w2.
    const size_t Fe = F / etp_size, f0 = size_t(etp_rank) * Fe;
    std::vector<float> w1(w.local_experts * H * 2 * Fe), w2(w.local_experts * Fe * H);
    for (size_t e = 0; e < size_t(w.local_experts); ++e) {
      for (size_t h = 0; h < H; ++h)
        for (size_t j = 0; j < Fe; ++j) {
          w1[(e * H + h) * 2 * Fe + j] = w.w1[(e * H + h) * 2 * F + f0 + j];
          w1[(e * H + h) * 2 * Fe + Fe + j] = w.w1[(e * H + h) * 2 * F + F + f0 + j];
        }
      std::copy(w.w2.begin() + (e * F + f0) * H, w.w2.begin() + (e * F + f0 + Fe) * H, w2.begin() + e * Fe * H);
    }
    w.w1 = std::move(w1);
    w.w2 = std::move(w2);
    w.ffn_first = int(f0);
    w.ffn_local = int(Fe);
  }
  if (S) {
    fill(w.shared_w1, H * 2 * S, seed, 5, 0, sh);
    fill(w.shared_w2, S * H, seed, 6, 0, 1.0f / std::sqrt(float(S)));
    if (c.shared_gate) fill(w.shared_gate, H, seed, 7, 0, sh);
  }
  return w;
}

MoeWeights zeros_like(const MoeWeights& w) {
  MoeWeights z = w;
  for (auto* v : {&z.router, &z.expert_bias, &z.w1, &z.w2, &z.shared_w1, &z.shared_w2, &z.shared_gate})
    std::fill(v->begin(), v->end(), 0.0f);
  return z;
}

}  // namespace lcplan::moe
