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
