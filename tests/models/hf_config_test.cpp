// Parsing Hugging Face config.json files: family rules, nested text_config, and clean errors for bad input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/hf_config.h"
#include "models/params.h"
#include "common/user_error.h"

namespace lcplan {
namespace {

using json = nlohmann::json;

std::string data_root() {
  const char* env = std::getenv("LCPLAN_DATA_DIR");
  return env && *env ? env : LCPLAN_SOURCE_DIR;
}

json zoo_file(const std::string& name) {
  std::ifstream in(data_root() + "/models/zoo/" + name + ".json");
  EXPECT_TRUE(in) << name;
  return json::parse(in);
}

json llama_toy() {
  return json::parse(R"({"model_type": "llama", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 6})");
}

json moe_toy() {
  return json::parse(R"({"model_type": "qwen3_moe", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 6, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 2})");
}

// The UserError message of parsing cfg, or "" when it parses.
std::string error_of(const json& cfg) {
  try {
    model_from_hf_config(cfg, "config.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Asserts cfg is rejected with one sentence that names the field.
void expect_rejected(const json& cfg, const std::string& field) {
  const std::string msg = error_of(cfg);
  ASSERT_FALSE(msg.empty()) << "accepted a config that should name " << field;
  EXPECT_NE(msg.find("\"" + field + "\""), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(HfConfigErrors, MissingRequiredField) {
  json cfg = llama_toy();
  cfg.erase("hidden_size");
  EXPECT_EQ(error_of(cfg), "config.json: field \"hidden_size\" is missing (expected a positive integer)");
}

TEST(HfConfigErrors, WrongTypesAndValues) {
  for (const json& bad : {json("2048"), json(2048.0), json(2048.5), json(0), json(-8), json(true), json::array(),
                          json::object(), json(1e300), json::parse("123456789012345678901234567890"),
                          json(18446744073709551615ull)}) {
    json cfg = llama_toy();
    cfg["hidden_size"] = bad;
    expect_rejected(cfg, "hidden_size");
  }
}

TEST(HfConfigErrors, HugeLayerCountIsRejectedNotAllocated) {
  json cfg = llama_toy();
  cfg["num_hidden_layers"] = 2000000000;
  expect_rejected(cfg, "num_hidden_layers");
}

TEST(HfConfigErrors, HeadsNotDivisibleByKvHeads) {
  json cfg = llama_toy();
  cfg["num_key_value_heads"] = 3;
  expect_rejected(cfg, "num_key_value_heads");
}

TEST(HfConfigErrors, HeadDimNeededWhenHiddenNotDivisible) {
  json cfg = llama_toy();
  cfg["num_attention_heads"] = 3;
  cfg["num_key_value_heads"] = 3;
  expect_rejected(cfg, "head_dim");
  cfg["head_dim"] = 4;
  EXPECT_EQ(error_of(cfg), "");
}

TEST(HfConfigErrors, TopKAboveExpertCount) {
  json cfg = moe_toy();
  cfg["num_experts_per_tok"] = 5;
  expect_rejected(cfg, "num_experts_per_tok");
}

TEST(HfConfigErrors, MoeFieldsMissing) {
  json cfg = moe_toy();
  cfg.erase("moe_intermediate_size");
  expect_rejected(cfg, "moe_intermediate_size");
  cfg = moe_toy();
  cfg.erase("num_experts_per_tok");
  expect_rejected(cfg, "num_experts_per_tok");
}

TEST(HfConfigErrors, LayerTypes) {
  json cfg = llama_toy();
  cfg["layer_types"] = {"full_attention"};
  expect_rejected(cfg, "layer_types");  // one entry for two layers
  cfg["layer_types"] = {"full_attention", "mamba"};
  expect_rejected(cfg, "layer_types[1]");
  cfg["layer_types"] = "full_attention";
  expect_rejected(cfg, "layer_types");
  cfg["layer_types"] = {"full_attention", "sliding_attention"};
  expect_rejected(cfg, "sliding_window");  // a sliding layer needs its window
  cfg["layer_types"] = {"full_attention", "linear_attention"};
  expect_rejected(cfg, "linear_num_key_heads");
}

TEST(HfConfigErrors, GatedDeltaNetHeadRatio) {
  json cfg = zoo_file("qwen3-next-80b-a3b");
  cfg["linear_num_value_heads"] = 24;  // not a multiple of the 16 key heads
  expect_rejected(cfg, "linear_num_value_heads");
}

TEST(HfConfigErrors, MlaAndRouterFields) {
  json cfg = zoo_file("deepseek-v3");
  cfg["q_lora_rank"] = "1536";
  expect_rejected(cfg, "q_lora_rank");
  cfg = zoo_file("deepseek-v3");
  cfg.erase("kv_lora_rank");
  expect_rejected(cfg, "kv_lora_rank");
  cfg = zoo_file("deepseek-v3");
  cfg["topk_group"] = 9;
  expect_rejected(cfg, "topk_group");
  cfg = zoo_file("deepseek-v3");
  cfg["n_group"] = 7;  // 256 experts do not split into 7 groups
  expect_rejected(cfg, "n_group");
  cfg = zoo_file("deepseek-v3");
  cfg["scoring_func"] = "relu";
  expect_rejected(cfg, "scoring_func");
  cfg = zoo_file("deepseek-v3");
  cfg["first_k_dense_replace"] = 62;
  expect_rejected(cfg, "first_k_dense_replace");
}

TEST(HfConfigErrors, OtherFieldTypes) {
  json cfg = moe_toy();
  cfg["mlp_only_layers"] = {0, 4};  // index 4 does not exist in a 4-layer model
  expect_rejected(cfg, "mlp_only_layers[1]");
  cfg = llama_toy();
  cfg["tie_word_embeddings"] = "yes";
  expect_rejected(cfg, "tie_word_embeddings");
  cfg = zoo_file("glm-4.5");
  cfg["partial_rotary_factor"] = 1.5;
  expect_rejected(cfg, "partial_rotary_factor");
  cfg = zoo_file("qwen3.5-35b-a3b");
  cfg["text_config"] = json::array();
  expect_rejected(cfg, "text_config");
}

TEST(HfConfigErrors, NotAnObjectOrNotJson) {
  EXPECT_NE(error_of(json::array()).find("must be a JSON object"), std::string::npos);
  EXPECT_NE(error_of(json(3)).find("must be a JSON object"), std::string::npos);
  for (const std::string& text : std::vector<std::string>{"", "{", "{\"hidden_size\": }", "[1, 2", "nul", std::string(100000, '[')}) {
    try {
      model_from_hf_config_text(text, "x.json");
      ADD_FAILURE() << "accepted invalid JSON";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("x.json is not valid JSON"), std::string::npos) << e.what();
    }
  }
}

// Replaces every top-level (and text_config) field of every family's config with hostile values: the parser must
// either accept the result or throw UserError, never anything else.
TEST(HfConfigErrors, NoCrashOnHostileValues) {
  const std::vector<json> hostile = {json(nullptr), json(-1), json(0), json(1), json(3.5), json(1e308), json("x"),
                                     json("\xff\xfe"), json::array(), json::array({1, "a", nullptr}), json::object(),
                                     json(true), json(18446744073709551615ull), json(-9223372036854775807ll - 1)};
  int accepted = 0, rejected = 0;
  for (const char* name : {"qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "qwen3-30b-a3b", "deepseek-v3", "moonlight-16b-a3b",
                           "mixtral-8x7b", "glm-4.5", "gpt-oss-120b", "llama-3.1-8b"}) {
    const json base = zoo_file(name);
    std::vector<std::pair<std::string, std::string>> paths;  // (holder, key)
    for (auto it = base.begin(); it != base.end(); ++it) paths.emplace_back("", it.key());
    if (base.contains("text_config"))
      for (auto it = base["text_config"].begin(); it != base["text_config"].end(); ++it)
        paths.emplace_back("text_config", it.key());
    for (const auto& [holder, key] : paths) {
      for (const json& v : hostile) {
        json cfg = base;
        (holder.empty() ? cfg : cfg[holder])[key] = v;
        try {
          const ModelSpec m = model_from_hf_config(cfg, name);
          const ParamCounts c = count_params(m);
          EXPECT_GT(c.total, 0) << name << " " << key;
          ++accepted;
        } catch (const UserError& e) {
          EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
          ++rejected;
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << ": " << key << " = " << v.dump(-1, ' ', false, json::error_handler_t::replace)
                        << " threw a non-user error: " << e.what();
        }
      }
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(accepted, 0);  // unknown/ignored keys are really ignored
}

TEST(HfConfigFamilies, NestedTextConfigMatchesFlattened) {
  const json nested = zoo_file("qwen3.5-35b-a3b");
  ASSERT_TRUE(nested.contains("text_config"));
  json flat = nested["text_config"];
  flat["tie_word_embeddings"] = nested["tie_word_embeddings"];
  const ModelSpec a = model_from_hf_config(nested, "nested"), b = model_from_hf_config(flat, "flat");
  EXPECT_EQ(a.hidden, 2048);
  EXPECT_EQ(a.layers.size(), 40u);
  EXPECT_DOUBLE_EQ(a.attn.partial_rotary, 0.25);  // read from text_config.rope_parameters
  EXPECT_DOUBLE_EQ(count_params(a).total, count_params(b).total);
  EXPECT_DOUBLE_EQ(count_params(a).active, count_params(b).active);
}

TEST(HfConfigFamilies, NestedFieldErrorsNameTextConfig) {
  json cfg = zoo_file("qwen3.5-35b-a3b");
  cfg["text_config"].erase("hidden_size");
  expect_rejected(cfg, "text_config.hidden_size");
}

TEST(HfConfigFamilies, TopLevelFallbackForTiedEmbeddings) {
  json cfg = zoo_file("qwen3.5-35b-a3b");
  cfg["tie_word_embeddings"] = true;  // outside text_config, as the Qwen3.5 wrapper writes it
  EXPECT_TRUE(model_from_hf_config(cfg, "x").tied_embeddings);
}

TEST(HfConfigFamilies, QwenNextHybridDefaults) {
  json cfg = zoo_file("qwen3-next-80b-a3b");
  cfg.erase("full_attention_interval");  // Qwen3NextConfig default is 4
  const ModelSpec m = model_from_hf_config(cfg, "x");
  for (size_t i = 0; i < m.layers.size(); ++i)
    EXPECT_EQ(m.layers[i].mixer, (i + 1) % 4 == 0 ? MixerKind::FullAttention : MixerKind::LinearAttention) << i;
  EXPECT_TRUE(m.attn.output_gate);
  EXPECT_TRUE(m.attn.qk_norm);
  EXPECT_TRUE(m.moe.shared_expert_gate);
  EXPECT_EQ(m.moe.shared_ffn, 512);
  EXPECT_EQ(m.mtp_layers, 1);
  EXPECT_DOUBLE_EQ(m.attn.partial_rotary, 0.25);
}

TEST(HfConfigFamilies, QwenMoeLayerPlacement) {
  json cfg = moe_toy();
  cfg["decoder_sparse_step"] = 2;  // MoE on layers whose (index+1) is a multiple of 2
  cfg["mlp_only_layers"] = {3};
  const ModelSpec m = model_from_hf_config(cfg, "x");
  const std::vector<FfnKind> want = {FfnKind::Dense, FfnKind::MoE, FfnKind::Dense, FfnKind::Dense};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(m.layers[i].ffn, want[i]) << i;
  EXPECT_TRUE(m.attn.qk_norm);  // implied by qwen3_moe
  EXPECT_EQ(m.dense_ffn, 6);
}

TEST(HfConfigFamilies, DeepSeekLayerPlacementAndRouter) {
  json cfg = zoo_file("deepseek-v3");
  cfg["moe_layer_freq"] = 2;
  const ModelSpec m = model_from_hf_config(cfg, "x");
  for (size_t i = 0; i < m.layers.size(); ++i) {
    EXPECT_EQ(m.layers[i].mixer, MixerKind::MLA);
    EXPECT_EQ(m.layers[i].ffn, i >= 3 && i % 2 == 0 ? FfnKind::MoE : FfnKind::Dense) << i;
  }
  EXPECT_EQ(m.moe.router, RouterKind::SigmoidGroupLimited);
  EXPECT_EQ(m.moe.n_group, 8);
  EXPECT_EQ(m.moe.topk_group, 4);
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.mtp_layers, 1);
}

TEST(HfConfigFamilies, Glm45) {
  const ModelSpec m = model_from_hf_config(zoo_file("glm-4.5"), "x");
  EXPECT_TRUE(m.attn.qk_norm);
  EXPECT_TRUE(m.attn.qkv_bias);
  EXPECT_FALSE(m.attn.o_bias);  // GLM-4.5's attention_bias leaves o_proj bias-free
  EXPECT_DOUBLE_EQ(m.attn.partial_rotary, 0.5);
  EXPECT_EQ(m.moe.router, RouterKind::SigmoidGroupLimited);
  EXPECT_EQ(m.layers[2].ffn, FfnKind::Dense);
  EXPECT_EQ(m.layers[3].ffn, FfnKind::MoE);
}

TEST(HfConfigFamilies, GptOssDefaultsToAlternatingSlidingLayers) {
  json cfg = zoo_file("gpt-oss-120b");
  cfg.erase("layer_types");
  const ModelSpec m = model_from_hf_config(cfg, "x");
  for (size_t i = 0; i < m.layers.size(); ++i) EXPECT_EQ(m.layers[i].sliding, i % 2 == 0) << i;
  EXPECT_EQ(m.attn.sliding_window, 128);
  EXPECT_TRUE(m.attn.sinks);
  EXPECT_TRUE(m.moe.expert_bias);
  EXPECT_EQ(m.moe.top_k, 4);
}

TEST(HfConfigFamilies, MistralSlidingWindowAppliesToAllLayers) {
  json cfg = llama_toy();
  cfg["model_type"] = "mistral";
  cfg["sliding_window"] = 4096;
  const ModelSpec m = model_from_hf_config(cfg, "x");
  for (const LayerSpec& l : m.layers) EXPECT_TRUE(l.sliding);
  cfg["model_type"] = "qwen3";  // Qwen ignores sliding_window unless use_sliding_window is set
  for (const LayerSpec& l : model_from_hf_config(cfg, "x").layers) EXPECT_FALSE(l.sliding);
}

TEST(HfConfigFamilies, UnknownFamilyWithLlamaFieldsParses) {
  json cfg = llama_toy();
  cfg["model_type"] = "someone_new";
  cfg["architectures"] = {"SomeoneNewForCausalLM"};
  cfg["some_future_field"] = {{"nested", {1, 2, 3}}};
  const ModelSpec m = model_from_hf_config(cfg, "x");
  EXPECT_EQ(m.attn.head_dim, 2);
  EXPECT_TRUE(m.tied_embeddings);  // PretrainedConfig's default when the file does not say
  cfg["tie_word_embeddings"] = false;
  EXPECT_FALSE(model_from_hf_config(cfg, "x").tied_embeddings);
}

TEST(HfConfigFamilies, FamilyFromArchitecturesWhenModelTypeMissing) {
  json cfg = zoo_file("mixtral-8x7b");
  cfg.erase("model_type");
  const ModelSpec m = model_from_hf_config(cfg, "x");
  EXPECT_EQ(m.moe.expert_ffn, 14336);  // Mixtral's intermediate_size is the expert FFN
  EXPECT_EQ(m.moe.num_experts, 8);
}

TEST(HfConfigFamilies, PublishedBlockIsCopied) {
  const ModelSpec m = model_from_hf_config(zoo_file("mixtral-8x7b"), "mixtral-8x7b");
  EXPECT_DOUBLE_EQ(m.published_total_params, 46.7e9);
  EXPECT_DOUBLE_EQ(m.published_active_params, 12.9e9);
  EXPECT_FALSE(m.notes.empty());
  json cfg = zoo_file("mixtral-8x7b");
  cfg["_lcplan"]["published"]["total_params"] = "46.7B";
  expect_rejected(cfg, "_lcplan.published.total_params");
}

}  // namespace
}  // namespace lcplan
