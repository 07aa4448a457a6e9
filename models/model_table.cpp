#include "models/model_table.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "models/params.h"
#include "models/zoo.h"

namespace lcplan {

namespace {

struct Mix {
  int full = 0, sliding = 0, linear = 0, mla = 0, dense = 0, moe = 0;
};

Mix count_mix(const ModelSpec& m) {
  Mix x;
  for (const LayerSpec& l : m.layers) {
    if (l.mixer == MixerKind::LinearAttention) ++x.linear;
    else if (l.mixer == MixerKind::MLA) ++x.mla;
    else if (l.sliding) ++x.sliding;
    else ++x.full;
    (l.ffn == FfnKind::MoE ? x.moe : x.dense) += 1;
  }
  return x;
}

std::string join_counts(const std::vector<std::pair<int, const char*>>& parts) {
  std::string s;
  for (const auto& [n, what] : parts)
    if (n > 0) s += (s.empty() ? "" : " + ") + std::to_string(n) + " " + what;
  return s;
}

std::string billions(double params) {
  char buf[32];
  std::snprintf(buf, sizeof buf, params >= 100e9 ? "%.1f" : "%.2f", params / 1e9);
  return buf;
}

// Published figure as the publisher wrote it: %g keeps "46.7" and "35" apart from our computed decimals.
std::string published(double params) {
  if (params <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", params / 1e9);
  return buf;
}

std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

}  // namespace

std::string layer_mix(const ModelSpec& m) {
  const Mix x = count_mix(m);
  return join_counts({{x.linear, "GDN"}, {x.sliding, "SWA"}, {x.full, "attn"}, {x.mla, "MLA"}});
}

nlohmann::json models_json(const std::string& data_dir) {
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : zoo_names(data_dir)) {
    const ModelSpec m = load_model(name, data_dir);
    const ParamCounts c = count_params(m);
    const Mix x = count_mix(m);
    nlohmann::json r;
    r["name"] = name;
    r["layers"] = m.layers.size();
    r["mix"] = {{"full_attention", x.full}, {"sliding_attention", x.sliding}, {"linear_attention", x.linear},
                {"mla", x.mla}, {"dense_ffn", x.dense}, {"moe", x.moe}, {"mtp", m.mtp_layers}};
    r["hidden"] = m.hidden;
    r["vocab"] = m.vocab;
    r["experts"] = {{"routed", x.moe ? m.moe.num_experts : 0}, {"top_k", x.moe ? m.moe.top_k : 0},
                    {"shared", x.moe ? m.moe.shared_experts : 0}};
    r["params"] = {{"total", c.total}, {"active", c.active}, {"total_with_mtp", c.total_with_mtp}};
    r["published"] = {{"total", m.published_total_params > 0 ? nlohmann::json(m.published_total_params) : nlohmann::json()},
                      {"active", m.published_active_params > 0 ? nlohmann::json(m.published_active_params) : nlohmann::json()}};
    r["notes"] = m.notes;
    rows.push_back(r);
  }
  return rows;
}

namespace {

const char* mixer_name(const LayerSpec& l) {
  switch (l.mixer) {
    case MixerKind::LinearAttention: return "gdn";
    case MixerKind::MLA: return "mla";
    case MixerKind::FullAttention: return l.sliding ? "swa" : "attn";
  }
  return "?";
}

std::string layer_kind(const LayerSpec& x) { return std::string(mixer_name(x)) + (x.ffn == FfnKind::MoE ? "+moe" : "+mlp"); }

// Layers [b, e) run-length encoded: "3 x gdn+moe, attn+moe".
std::string runs_of(const ModelSpec& m, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e;) {
    size_t j = i;
    while (j < e && layer_kind(m.layers[j]) == layer_kind(m.layers[i])) ++j;
    out += (out.empty() ? "" : ", ") + (j - i > 1 ? std::to_string(j - i) + " x " : std::string()) + layer_kind(m.layers[i]);
    i = j;
  }
  return out;
}

// The layer pattern: the shortest block that repeats through every layer ("10 x (3 x gdn+moe, attn+moe)"), else runs.
std::string layer_pattern(const ModelSpec& m) {
  const size_t n = m.layers.size();
  for (size_t p = 2; p < n; ++p) {  // a block of one layer reads better as a run
    if (n % p != 0) continue;
    bool repeats = true;
    for (size_t i = p; i < n && repeats; ++i) repeats = layer_kind(m.layers[i]) == layer_kind(m.layers[i - p]);
    if (repeats) return std::to_string(n / p) + " x (" + runs_of(m, 0, p) + ")";
  }
  return runs_of(m, 0, n);
}

}  // namespace

nlohmann::json model_details_json(const ModelSpec& m) {
  const ParamCounts c = count_params(m);
  const Mix x = count_mix(m);
  nlohmann::json j = {{"name", m.name}, {"hidden", m.hidden}, {"vocab", m.vocab}, {"tied_embeddings", m.tied_embeddings},
                      {"gated_mlp", m.gated_mlp}, {"dense_ffn", m.dense_ffn}, {"max_position", m.max_position},
                      {"layers", m.layers.size()}, {"pattern", layer_pattern(m)}, {"mtp_layers", m.mtp_layers}};
  if (x.full + x.sliding > 0)
    j["attention"] = {{"heads", m.attn.heads}, {"kv_heads", m.attn.kv_heads}, {"head_dim", m.attn.head_dim},
                      {"output_gate", m.attn.output_gate}, {"partial_rotary", m.attn.partial_rotary},
                      {"sliding_window", m.attn.sliding_window}, {"qkv_bias", m.attn.qkv_bias}, {"o_bias", m.attn.o_bias},
                      {"qk_norm", m.attn.qk_norm}, {"sinks", m.attn.sinks}};
  if (x.linear > 0)
    j["linear_attention"] = {{"key_heads", m.linear.key_heads}, {"value_heads", m.linear.value_heads},
                             {"key_head_dim", m.linear.key_head_dim}, {"value_head_dim", m.linear.value_head_dim},
                             {"conv_kernel", m.linear.conv_kernel}};
  if (x.mla > 0)
    j["mla"] = {{"heads", m.mla.heads}, {"q_lora_rank", m.mla.q_lora_rank}, {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim}, {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
  if (x.moe > 0)
    j["moe"] = {{"experts", m.moe.num_experts}, {"top_k", m.moe.top_k}, {"expert_ffn", m.moe.expert_ffn},
                {"shared_experts", m.moe.shared_experts}, {"shared_ffn", m.moe.shared_ffn},
                {"shared_expert_gate", m.moe.shared_expert_gate}, {"expert_bias", m.moe.expert_bias},
                {"router", m.moe.router == RouterKind::SoftmaxTopK ? "softmax top-k" : "sigmoid group-limited"},
                {"groups", m.moe.n_group}, {"top_groups", m.moe.topk_group}, {"latent", m.moe.latent},
                {"moe_layers", x.moe}};
  j["params"] = {{"embedding", c.embedding}, {"lm_head", c.lm_head}, {"final_norm", c.final_norm},
                 {"decoder", c.decoder}, {"routed_experts", c.routed_experts}, {"mtp", c.mtp}, {"total", c.total},
                 {"total_with_mtp", c.total_with_mtp}, {"active", c.active}};
  return j;
}

std::string model_details(const ModelSpec& m) {
  const nlohmann::json j = model_details_json(m);
  std::ostringstream out;
  out << m.name << ": " << m.layers.size() << " layers (" << j.at("pattern").get<std::string>() << ")";
  if (m.mtp_layers) out << " + " << m.mtp_layers << " MTP";
  out << "\n";
  for (const auto& [group, v] : j.items()) {
    if (!v.is_object()) continue;
    out << "  " << pad(group, 17);
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out << (first ? "" : ", ") << k << " " << (x.is_number_float() && group == "params" ? billions(x.get<double>()) + "B" : x.dump());
      first = false;
    }
    out << "\n";
  }
  out << "  hidden " << m.hidden << ", vocab " << m.vocab << (m.tied_embeddings ? " (tied)" : " (untied)") << ", dense ffn "
      << m.dense_ffn << (m.gated_mlp ? " (gated)" : "") << ", max position " << m.max_position << "\n";
  return out.str();
}

std::string models_table(const std::string& data_dir) {
  const std::vector<std::string> head = {"model", "layers", "hidden", "experts (routed/top-k/shared)", "vocab",
                                         "total B", "active B", "published total/active B"};
  std::vector<std::vector<std::string>> rows;
  for (const std::string& name : zoo_names(data_dir)) {
    const ModelSpec m = load_model(name, data_dir);
    const ParamCounts c = count_params(m);
    const Mix x = count_mix(m);
    std::string layers = std::to_string(m.layers.size()) + " = " + layer_mix(m);
    if (x.moe > 0 && x.dense > 0) layers += " (" + std::to_string(x.dense) + " dense FFN)";
    if (m.mtp_layers > 0) layers += ", +" + std::to_string(m.mtp_layers) + " MTP";
    const std::string experts = x.moe == 0 ? "dense"
                                           : std::to_string(m.moe.num_experts) + "/" + std::to_string(m.moe.top_k) + "/" +
                                                 std::to_string(m.moe.shared_experts);
    rows.push_back({name, layers, std::to_string(m.hidden), experts, std::to_string(m.vocab), billions(c.total),
                    billions(c.active),
                    published(m.published_total_params) + " / " + published(m.published_active_params)});
  }
  std::vector<size_t> width(head.size());
  for (size_t i = 0; i < head.size(); ++i) {
    width[i] = head[i].size();
    for (const auto& r : rows) width[i] = std::max(width[i], r[i].size());
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size(); ++i) out << (i ? "  " : "") << (i + 1 < r.size() ? pad(r[i], width[i]) : r[i]);
    out << "\n";
  };
  line(head);
  for (const auto& r : rows) line(r);
  out << "Parameters in billions (1e9). Totals exclude MTP modules, as publishers count. Our active counts include the "
         "embedding and LM head; publishers differ (see published.active_counts in each zoo file).\n";
  return out.str();
}

}  // namespace lcplan
