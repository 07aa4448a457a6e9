// Shared by the CPU and GPU single-layer proxies: sequence-length parsing, labels, and the MoE layer config of a
// zoo model (optionally scaled down), so both programs proxy the same layer the same way.
#pragma once

#include <algorithm>
#include <string>

#include "kernels/moe/moe_layer.h"
#include "models/model_spec.h"
#include "common/user_error.h"

namespace lcplan::moe_proxy {

// "4k" = 4096 tokens, as the article writes local sequence lengths.
inline int parse_tokens(const std::string& s) {
  size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(s, &pos);
  } catch (...) {
    throw UserError("sequence length '" + s + "' is not a number like 4096 or 4k");
  }
  if (pos < s.size() && (s[pos] == 'k' || s[pos] == 'K')) v *= 1024, ++pos;
  if (pos != s.size() || v < 1 || v > (1 << 24))
    throw UserError("sequence length '" + s + "' is not a number like 4096 or 4k between 1 and 16M");
  return static_cast<int>(v);
}

inline std::string label_seq(int t) { return t % 1024 == 0 ? std::to_string(t / 1024) + "K" : std::to_string(t); }

// The model's MoE layer with the given sizes (hidden, experts, ffn, top_k, shared_ffn >= 0; shared_ffn is used only
// when the model has a shared expert); router kind, gate and group structure come from the model.
inline moe::MoeConfig layer_config(const ModelSpec& spec, int hidden, int experts, int ffn, int top_k, int shared_ffn) {
  if (spec.moe.num_experts == 0) throw UserError("model " + spec.name + " has no MoE layers to proxy");
  moe::MoeConfig c;
  c.hidden = hidden;
  c.experts = experts;
  c.top_k = top_k;
  c.expert_ffn = ffn;
  c.shared_ffn = spec.moe.shared_experts > 0 ? shared_ffn : 0;
  c.shared_gate = spec.moe.shared_expert_gate;
  if (spec.moe.router == RouterKind::SigmoidGroupLimited) {
    c.router = moe::Router::SigmoidGroupLimited;
    // Keep the model's group structure where the (scaled) expert count allows it.
    c.n_group = std::max(1, std::min(spec.moe.n_group, experts));
    while (experts % c.n_group) --c.n_group;
    c.topk_group = std::min(spec.moe.topk_group, c.n_group);
    while (c.topk_group * (experts / c.n_group) < top_k && c.topk_group < c.n_group) ++c.topk_group;
  }
  return c;
}

}  // namespace lcplan::moe_proxy
