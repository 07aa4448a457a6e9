#include "models/hf_config.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>

#include "common/user_error.h"

namespace lcplan {

namespace {

using json = nlohmann::json;

// Upper bounds keep every product finite and every allocation small whatever the file says.
constexpr int64_t kMaxDim = int64_t(1) << 30;
constexpr int64_t kMaxLayers = 10000;

// Model families whose HF config classes differ in field meaning or defaults.
enum class Family { Generic, Llama, Qwen2, Qwen2Moe, Qwen3, Qwen3Moe, Qwen3Next, Mixtral, DeepSeekV2, DeepSeekV3, Glm4Moe, GptOss };

std::optional<Family> family_from_model_type(std::string_view t) {
  if (t == "llama" || t == "mistral") return Family::Llama;
  if (t == "qwen2") return Family::Qwen2;
  if (t == "qwen2_moe") return Family::Qwen2Moe;
  if (t == "qwen3") return Family::Qwen3;
  if (t == "qwen3_moe") return Family::Qwen3Moe;
  // Qwen3.5 (dense and MoE, text and multimodal wrappers) share Qwen3-Next's hybrid layer design.
  if (t == "qwen3_next" || t == "qwen3_5" || t == "qwen3_5_text" || t == "qwen3_5_moe" || t == "qwen3_5_moe_text")
    return Family::Qwen3Next;
  if (t == "mixtral") return Family::Mixtral;
  if (t == "deepseek_v2") return Family::DeepSeekV2;
  if (t == "deepseek_v3" || t == "kimi_k2") return Family::DeepSeekV3;
  if (t == "glm4_moe") return Family::Glm4Moe;
  if (t == "gpt_oss") return Family::GptOss;
  return std::nullopt;
}

std::optional<Family> family_from_architecture(std::string_view a) {
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") return Family::Llama;
  if (a == "Qwen2ForCausalLM") return Family::Qwen2;
  if (a == "Qwen2MoeForCausalLM") return Family::Qwen2Moe;
  if (a == "Qwen3ForCausalLM") return Family::Qwen3;
  if (a == "Qwen3MoeForCausalLM") return Family::Qwen3Moe;
  if (a == "Qwen3NextForCausalLM" || a.starts_with("Qwen3_5")) return Family::Qwen3Next;
  if (a == "MixtralForCausalLM") return Family::Mixtral;
  if (a == "DeepseekV2ForCausalLM") return Family::DeepSeekV2;
  if (a == "DeepseekV3ForCausalLM") return Family::DeepSeekV3;
  if (a == "Glm4MoeForCausalLM") return Family::Glm4Moe;
  if (a == "GptOssForCausalLM") return Family::GptOss;
  return std::nullopt;
}

// Short rendering of a bad value for an error message; containers are named, never dumped (they may be huge).
std::string show(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "an invalid value";
    default: break;
  }
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads fields the way HF does for multimodal wrappers: the text model's fields live in text_config when present;
// anything not found there (e.g. tie_word_embeddings on Qwen3.5) is looked up at the top level.
class Fields {
 public:
  Fields(const json& root, std::string origin) : root_(root), origin_(std::move(origin)) {
    if (!root_.is_object()) fail("must be a JSON object, got " + show(root_));
    if (auto it = root_.find("text_config"); it != root_.end() && !it->is_null()) {
      if (!it->is_object()) field_fail("text_config", "must be an object, got " + show(*it));
      text_ = &*it;
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw UserError(origin_ + " " + what); }
  [[noreturn]] void field_fail(const std::string& label, const std::string& what) const {
    throw UserError(origin_ + ": field \"" + label + "\" " + what);
  }

  // The value for key (nullptr when absent or null) and the label used to name it in errors.
  const json* find(const std::string& key) const {
    if (text_) {
      if (auto it = text_->find(key); it != text_->end() && !it->is_null()) return &*it;
    }
    if (auto it = root_.find(key); it != root_.end() && !it->is_null()) return &*it;
    return nullptr;
  }
  std::string label(const std::string& key) const {
    if (text_ && !text_->contains(key) && root_.contains(key)) return key;
    return text_ ? "text_config." + key : key;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  int64_t to_int(const json& v, const std::string& label, int64_t lo, int64_t hi, const std::string& what) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= uint64_t(hi) && int64_t(u) >= lo) return int64_t(u);
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if (x >= lo && x <= hi) return x;
    } else {
      field_fail(label, "must be " + what + ", got " + show(v));
    }
    // Too large only when above hi (0 parses as unsigned, and is too small for a positive field).
    const bool above = v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(hi) : v.get<int64_t>() > hi;
    if (above) field_fail(label, "must be at most " + std::to_string(hi) + ", got " + show(v));
    field_fail(label, "must be " + what + ", got " + show(v));
  }

  int req_pos(const std::string& key, int64_t hi = kMaxDim) const {
    const json* v = find(key);
    if (!v) field_fail(label(key), "is missing (expected a positive integer)");
    return int(to_int(*v, label(key), 1, hi, "a positive integer"));
  }
  int opt_pos(const std::string& key, int fallback, int64_t hi = kMaxDim) const {
    const json* v = find(key);
    return v ? int(to_int(*v, label(key), 1, hi, "a positive integer")) : fallback;
  }
  int opt_nonneg(const std::string& key, int fallback, int64_t hi = kMaxDim) const {
    const json* v = find(key);
    return v ? int(to_int(*v, label(key), 0, hi, "a non-negative integer")) : fallback;
  }
  bool opt_bool(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) field_fail(label(key), "must be true or false, got " + show(*v));
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) field_fail(label(key), "must be a string, got " + show(*v));
    return v->get<std::string>();
  }
  // A number in (lo, hi]; ints and floats both accepted since HF writes e.g. 1 or 1.0 for fractions.
  double opt_fraction(const json& v, const std::string& label, double fallback) const {
    if (v.is_null()) return fallback;
    if (!v.is_number()) field_fail(label, "must be a number in (0, 1], got " + show(v));
    const double x = v.get<double>();
    if (!(x > 0 && x <= 1)) field_fail(label, "must be a number in (0, 1], got " + show(v));
    return x;
  }

  const json& root() const { return root_; }
  const json* text() const { return text_; }

 private:
  const json& root_;
  const json* text_ = nullptr;
  std::string origin_;
};

Family detect_family(const Fields& f) {
  // The text model's type wins (Qwen3.5 wrapper: qwen3_5_moe outside, qwen3_5_moe_text inside).
  for (const json* where : {f.text(), &f.root()}) {
    if (!where) continue;
    if (auto it = where->find("model_type"); it != where->end() && it->is_string())
      if (auto fam = family_from_model_type(it->get<std::string>())) return *fam;
  }
  if (const json* a = f.find("architectures")) {
    if (a->is_string()) {
      if (auto fam = family_from_architecture(a->get<std::string>())) return *fam;
    } else if (a->is_array()) {
      for (const json& e : *a)
        if (e.is_string())
          if (auto fam = family_from_architecture(e.get<std::string>())) return *fam;
    }
  }
  return Family::Generic;
}

bool is_qwen(Family fam) {
  return fam == Family::Qwen2 || fam == Family::Qwen2Moe || fam == Family::Qwen3 || fam == Family::Qwen3Moe ||
         fam == Family::Qwen3Next;
}

enum class LayerType { Full, Sliding, Linear };

// Per-layer token mixer from layer_types, full_attention_interval, or the family's default pattern.
std::vector<LayerType> layer_types(const Fields& f, Family fam, int n) {
  std::vector<LayerType> types(size_t(n), LayerType::Full);
  if (const json* lt = f.find("layer_types")) {
    const std::string lab = f.label("layer_types");
    if (!lt->is_array())
      f.field_fail(lab, "must be a list of \"full_attention\", \"linear_attention\" or \"sliding_attention\", got " + show(*lt));
    if (lt->size() != size_t(n))
      f.field_fail(lab, "has " + std::to_string(lt->size()) + " entries but num_hidden_layers is " + std::to_string(n) +
                            " (expected one entry per layer)");
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      const std::string s = e.is_string() ? e.get<std::string>() : std::string();
      if (s == "full_attention" || s == "attention") types[i] = LayerType::Full;
      else if (s == "sliding_attention") types[i] = LayerType::Sliding;
      else if (s == "linear_attention") types[i] = LayerType::Linear;
      else
        f.field_fail(lab + "[" + std::to_string(i) + "]",
                     "must be \"full_attention\", \"linear_attention\" or \"sliding_attention\", got " + show(e));
    }
    return types;
  }
  if (fam == Family::Qwen3Next || f.has("full_attention_interval")) {
    // Qwen3NextConfig default: every 4th layer is full attention, the rest gated DeltaNet.
    const int interval = f.opt_pos("full_attention_interval", 4);
    for (int i = 0; i < n; ++i) types[size_t(i)] = (i + 1) % interval == 0 ? LayerType::Full : LayerType::Linear;
    return types;
  }
  if (fam == Family::GptOss) {
    // GptOssConfig default: even layers sliding, odd layers full.
    for (int i = 0; i < n; ++i) types[size_t(i)] = (i + 1) % 2 ? LayerType::Sliding : LayerType::Full;
    return types;
  }
  const int window = f.opt_nonneg("sliding_window", 0);
  if (window > 0) {
    if (is_qwen(fam)) {
      // Qwen2/3: sliding only with use_sliding_window, and only from max_window_layers on.
      if (f.opt_bool("use_sliding_window", false)) {
        const int from = f.opt_nonneg("max_window_layers", n, kMaxLayers);
        for (int i = from; i < n; ++i) types[size_t(i)] = LayerType::Sliding;
      }
    } else {
      // Mistral-style: a non-null sliding_window applies to every layer.
      std::fill(types.begin(), types.end(), LayerType::Sliding);
    }
  }
  return types;
}

// Which decoder layers use the MoE block: Qwen's decoder_sparse_step / mlp_only_layers and DeepSeek's
// first_k_dense_replace / moe_layer_freq (both sets default to "every layer").
std::vector<bool> moe_layers(const Fields& f, int n) {
  std::vector<bool> moe(size_t(n), true);
  std::set<int64_t> mlp_only;
  if (const json* v = f.find("mlp_only_layers")) {
    const std::string lab = f.label("mlp_only_layers");
    if (!v->is_array()) f.field_fail(lab, "must be a list of layer indices, got " + show(*v));
    for (size_t i = 0; i < v->size(); ++i)
      mlp_only.insert(f.to_int((*v)[i], lab + "[" + std::to_string(i) + "]", 0, n - 1,
                               "a layer index from 0 to " + std::to_string(n - 1)));
  }
  const int step = f.opt_pos("decoder_sparse_step", 1, kMaxLayers);
  const int first_dense = f.opt_nonneg("first_k_dense_replace", 0, kMaxLayers);
  if (first_dense > n)
    f.field_fail(f.label("first_k_dense_replace"),
                 "must be at most num_hidden_layers (" + std::to_string(n) + "), got " + std::to_string(first_dense));
  const int freq = f.opt_pos("moe_layer_freq", 1, kMaxLayers);
  for (int i = 0; i < n; ++i)
    moe[size_t(i)] = !mlp_only.count(i) && (i + 1) % step == 0 && i >= first_dense && i % freq == 0;
  return moe;
}

// Fraction of head_dim that is rotary: partial_rotary_factor at the top (or in text_config), else inside
// rope_parameters / rope_scaling (transformers v5 moves it there).
double partial_rotary(const Fields& f) {
  if (const json* v = f.find("partial_rotary_factor")) return f.opt_fraction(*v, f.label("partial_rotary_factor"), 1.0);
  for (const char* holder : {"rope_parameters", "rope_scaling"}) {
    const json* r = f.find(holder);
    if (r && r->is_object()) {
      if (auto it = r->find("partial_rotary_factor"); it != r->end())
        return f.opt_fraction(*it, f.label(holder) + ".partial_rotary_factor", 1.0);
    }
  }
  return 1.0;
}

void read_published(const json& root, const std::string& origin, ModelSpec& m) {
  auto it = root.find("_lcplan");
  if (it == root.end() || it->is_null()) return;
  auto bad = [&](const std::string& field, const std::string& what) {
    throw UserError(origin + ": field \"_lcplan." + field + "\" " + what);
  };
  if (!it->is_object()) bad("", "must be an object");
  const json& meta = *it;
  if (auto r = meta.find("reliability"); r != meta.end() && !r->is_null()) {
    if (!r->is_string()) bad("reliability", "must be a string, got " + show(*r));
    m.notes = r->get<std::string>();
  }
  auto p = meta.find("published");
  if (p == meta.end() || p->is_null()) return;
  if (!p->is_object()) bad("published", "must be an object, got " + show(*p));
  auto number = [&](const char* key) -> double {
    auto v = p->find(key);
    if (v == p->end() || v->is_null()) return 0;
    if (!v->is_number() || v->get<double>() < 0)
      bad(std::string("published.") + key, "must be a non-negative number or null, got " + show(*v));
    return v->get<double>();
  };
  m.published_total_params = number("total_params");
  m.published_active_params = number("active_params");
}

}  // namespace

ModelSpec model_from_hf_config(const json& config, const std::string& name) {
  const std::string origin = name.empty() ? "config.json" : name;
  const Fields f(config, origin);
  const Family fam = detect_family(f);

  ModelSpec m;
  m.name = name;
  m.hidden = f.req_pos("hidden_size");
  m.vocab = f.req_pos("vocab_size");
  const int n_layers = f.req_pos("num_hidden_layers", kMaxLayers);
  m.max_position = f.opt_nonneg("max_position_embeddings", 0);
  // PretrainedConfig defaults to tied embeddings; every family config class listed here overrides it to false.
  m.tied_embeddings = f.opt_bool("tie_word_embeddings", fam == Family::Generic);
  m.mtp_layers = f.opt_nonneg("mtp_num_hidden_layers", f.opt_nonneg("num_nextn_predict_layers", 0, 1000), 1000);

  const int heads = f.req_pos("num_attention_heads");
  const bool is_mla = fam == Family::DeepSeekV2 || fam == Family::DeepSeekV3 || f.has("kv_lora_rank");
  const std::vector<LayerType> types = is_mla ? std::vector<LayerType>(size_t(n_layers), LayerType::Full)
                                              : layer_types(f, fam, n_layers);
  const bool any_linear = std::count(types.begin(), types.end(), LayerType::Linear) > 0;
  const bool any_sliding = std::count(types.begin(), types.end(), LayerType::Sliding) > 0;
  const bool any_full = !is_mla && std::count(types.begin(), types.end(), LayerType::Linear) < n_layers;

  if (is_mla) {
    MlaSpec& a = m.mla;
    a.heads = heads;
    a.q_lora_rank = f.opt_nonneg("q_lora_rank", 0);  // null = no query compression
    a.kv_lora_rank = f.req_pos("kv_lora_rank");
    a.qk_nope_head_dim = f.req_pos("qk_nope_head_dim");
    a.qk_rope_head_dim = f.req_pos("qk_rope_head_dim");
    a.v_head_dim = f.req_pos("v_head_dim");
  }
  if (any_full) {
    AttentionSpec& a = m.attn;
    a.heads = heads;
    a.kv_heads = f.opt_pos("num_key_value_heads", heads);
    if (heads % a.kv_heads != 0)
      f.field_fail(f.label("num_key_value_heads"), "must divide num_attention_heads (" + std::to_string(heads) + "), got " +
                                                       std::to_string(a.kv_heads));
    if (f.has("head_dim")) {
      a.head_dim = f.req_pos("head_dim");
    } else if (m.hidden % heads != 0) {
      f.field_fail(f.label("head_dim"), "is missing and hidden_size " + std::to_string(m.hidden) +
                                            " is not divisible by num_attention_heads " + std::to_string(heads) +
                                            " (give head_dim explicitly)");
    } else {
      a.head_dim = m.hidden / heads;
    }
    a.partial_rotary = partial_rotary(f);
    a.output_gate = f.opt_bool("attn_output_gate", fam == Family::Qwen3Next);
    const bool bias = f.opt_bool("attention_bias", false);
    // Qwen2 always biases q/k/v (not o); GLM-4.5's attention_bias covers q/k/v only; Llama/Qwen3/gpt-oss all four.
    a.qkv_bias = fam == Family::Qwen2 || fam == Family::Qwen2Moe || bias;
    a.o_bias = bias && fam != Family::Glm4Moe && fam != Family::Qwen2 && fam != Family::Qwen2Moe;
    const bool qwen3_norm = fam == Family::Qwen3 || fam == Family::Qwen3Moe || fam == Family::Qwen3Next;
    a.qk_norm = f.opt_bool("use_qk_norm", qwen3_norm);
    a.sinks = fam == Family::GptOss;
    if (any_sliding) a.sliding_window = f.req_pos("sliding_window");
  }
  if (any_linear) {
    LinearAttentionSpec& g = m.linear;
    g.key_heads = f.req_pos("linear_num_key_heads");
    g.value_heads = f.req_pos("linear_num_value_heads");
    g.key_head_dim = f.req_pos("linear_key_head_dim");
    g.value_head_dim = f.req_pos("linear_value_head_dim");
    g.conv_kernel = f.req_pos("linear_conv_kernel_dim");
    if (g.value_heads % g.key_heads != 0)
      f.field_fail(f.label("linear_num_value_heads"), "must be a multiple of linear_num_key_heads (" +
                                                          std::to_string(g.key_heads) + "), got " +
                                                          std::to_string(g.value_heads));
  }

  // Experts: n_routed_experts (DeepSeek/GLM), num_experts (Qwen), num_local_experts (Mixtral/gpt-oss).
  int experts = 0;
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (f.has(key)) {
      experts = f.opt_nonneg(key, 0);
      break;
    }
  std::vector<bool> moe = experts > 0 ? moe_layers(f, n_layers) : std::vector<bool>(size_t(n_layers), false);
  const bool any_moe = std::count(moe.begin(), moe.end(), true) > 0;
  const bool any_dense = std::count(moe.begin(), moe.end(), false) > 0;
  // Mixtral and gpt-oss name the expert FFN intermediate_size; everyone else uses moe_intermediate_size.
  const bool ffn_is_expert = fam == Family::Mixtral || fam == Family::GptOss ||
                             (fam == Family::Generic && experts > 0 && !f.has("moe_intermediate_size"));
  if (any_dense) m.dense_ffn = f.req_pos("intermediate_size");
  else if (!ffn_is_expert) m.dense_ffn = f.opt_pos("intermediate_size", 0);

  if (any_moe) {
    MoeSpec& e = m.moe;
    e.num_experts = experts;
    e.expert_ffn = ffn_is_expert ? f.req_pos("intermediate_size") : f.req_pos("moe_intermediate_size");
    const char* topk_key = f.has("num_experts_per_tok") || !f.has("experts_per_token") ? "num_experts_per_tok" : "experts_per_token";
    e.top_k = f.req_pos(topk_key);
    if (e.top_k > experts)
      f.field_fail(f.label(topk_key), "must be at most the number of experts (" + std::to_string(experts) + "), got " +
                                          std::to_string(e.top_k));
    if (f.has("n_shared_experts")) {
      // DeepSeek/GLM: n shared experts of moe_intermediate_size each (HF merges them into one MLP of n times that).
      e.shared_experts = f.opt_nonneg("n_shared_experts", 0);
      e.shared_ffn = e.shared_experts > 0 ? e.expert_ffn : 0;
    } else if (f.opt_nonneg("shared_expert_intermediate_size", 0) > 0) {
      // Qwen2-MoE / Qwen3-Next / Qwen3.5: one shared expert behind a sigmoid gate.
      e.shared_experts = 1;
      e.shared_ffn = f.opt_nonneg("shared_expert_intermediate_size", 0);
      e.shared_expert_gate = true;
    }
    e.expert_bias = fam == Family::GptOss;
    // Latent MoE under Megatron-LM's name for it (--moe-latent-size; no public config.json in lcplan's sources names it).
    e.latent = f.opt_nonneg("moe_latent_size", 0);
    const bool sigmoid_default = fam == Family::DeepSeekV3 || fam == Family::Glm4Moe;
    const std::string scoring = f.opt_string("scoring_func").value_or(sigmoid_default ? "sigmoid" : "softmax");
    if (scoring != "sigmoid" && scoring != "softmax")
      f.field_fail(f.label("scoring_func"), "must be \"sigmoid\" or \"softmax\", got \"" + scoring + "\"");
    e.router = scoring == "sigmoid" ? RouterKind::SigmoidGroupLimited : RouterKind::SoftmaxTopK;
    e.n_group = f.opt_pos("n_group", 1);
    e.topk_group = f.opt_pos("topk_group", 1);
    if (experts % e.n_group != 0)
      f.field_fail(f.label("n_group"), "must divide the number of experts (" + std::to_string(experts) + "), got " +
                                           std::to_string(e.n_group));
    if (e.topk_group > e.n_group)
      f.field_fail(f.label("topk_group"), "must be at most n_group (" + std::to_string(e.n_group) + "), got " +
                                              std::to_string(e.topk_group));
  }

  m.layers.resize(size_t(n_layers));
  for (size_t i = 0; i < m.layers.size(); ++i) {
    LayerSpec& l = m.layers[i];
    l.mixer = is_mla ? MixerKind::MLA : types[i] == LayerType::Linear ? MixerKind::LinearAttention : MixerKind::FullAttention;
    l.sliding = !is_mla && types[i] == LayerType::Sliding;
    l.ffn = moe[i] ? FfnKind::MoE : FfnKind::Dense;
  }
  read_published(config, origin, m);
  return m;
}

ModelSpec model_from_hf_config_text(const std::string& text, const std::string& name) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond double (1e320)
    std::string why = e.what();
    if (auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);  // drop "[json.exception...]"
    throw UserError((name.empty() ? std::string("config.json") : name) + " is not valid JSON (" + why + ")");
  }
  return model_from_hf_config(config, name);
}

}  // namespace lcplan
