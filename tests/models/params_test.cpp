// Hand-counted parameter totals of 2-layer toy models, one per layer kind. Every toy has hidden 8 and vocab 10, so
// embedding = LM head = 10*8 = 80 and the final norm = 8; each decoder layer has two RMSNorms (2*8 = 16).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/hf_config.h"
#include "models/params.h"

namespace lcplan {
namespace {

using json = nlohmann::json;

json llama_toy() {
  return json::parse(R"({"model_type": "llama", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 6, "tie_word_embeddings": false})");
}

TEST(ToyParams, DenseGqaSwiGlu) {
  const ParamCounts c = count_params(model_from_hf_config(llama_toy(), "toy"));
  // per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; SwiGLU 3*8*6 = 144; norms 16 -> 352
  EXPECT_DOUBLE_EQ(c.decoder, 704);
  EXPECT_DOUBLE_EQ(c.total, 704 + 80 + 80 + 8);
  EXPECT_DOUBLE_EQ(c.active, c.total);  // dense: every parameter is active
}

TEST(ToyParams, TiedEmbeddingsDropTheLmHead) {
  json cfg = llama_toy();
  cfg["tie_word_embeddings"] = true;
  const ParamCounts c = count_params(model_from_hf_config(cfg, "toy"));
  EXPECT_DOUBLE_EQ(c.lm_head, 0);
  EXPECT_DOUBLE_EQ(c.total, 704 + 80 + 8);
}

TEST(ToyParams, LlamaAttentionBiasCoversQkvAndO) {
  json cfg = llama_toy();
  cfg["attention_bias"] = true;
  // biases per layer: q 8 + k 4 + v 4 + o 8 = 24
  EXPECT_DOUBLE_EQ(count_params(model_from_hf_config(cfg, "toy")).total, 872 + 2 * 24);
}

// Qwen3-Next style: layer 0 gated DeltaNet, layer 1 gated GQA; both MoE with a gated shared expert; one MTP module.
json hybrid_toy() {
  return json::parse(R"({"model_type": "qwen3_next", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 2, "linear_value_head_dim": 3,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 2, "shared_expert_intermediate_size": 3,
    "mtp_num_hidden_layers": 1, "tie_word_embeddings": false})");
}

TEST(ToyParams, GatedDeltaNetLayer) {
  const ModelSpec m = model_from_hf_config(hybrid_toy(), "toy");
  ASSERT_EQ(m.layers[0].mixer, MixerKind::LinearAttention);
  const LayerParams p = layer_params(m, m.layers[0]);
  // k = 2*2 = 4, v = 4*3 = 12: qkvz 8*(2*4 + 2*12) = 256, ba 8*2*4 = 64, conv (2*4 + 12)*4 = 80, out 12*8 = 96
  EXPECT_DOUBLE_EQ(p.mixer, 496);
  EXPECT_DOUBLE_EQ(p.mixer_replicated, 11);  // A_log 4 + dt_bias 4 + gated norm 3
}

TEST(ToyParams, GatedAttentionLayerWithQkNorm) {
  const ModelSpec m = model_from_hf_config(hybrid_toy(), "toy");
  ASSERT_EQ(m.layers[1].mixer, MixerKind::FullAttention);
  ASSERT_TRUE(m.attn.output_gate);  // implied by qwen3_next
  const LayerParams p = layer_params(m, m.layers[1]);
  // q with gate 8*16*2 = 256, k 8*8 = 64, v 64, o 16*8 = 128
  EXPECT_DOUBLE_EQ(p.mixer, 512);
  EXPECT_DOUBLE_EQ(p.mixer_replicated, 8);  // q_norm + k_norm over head_dim 4
}

TEST(ToyParams, MoeWithGatedSharedExpert) {
  const ModelSpec m = model_from_hf_config(hybrid_toy(), "toy");
  const LayerParams p = layer_params(m, m.layers[1]);
  EXPECT_DOUBLE_EQ(p.routed_experts, 4 * 48);  // one expert 3*8*2 = 48
  EXPECT_DOUBLE_EQ(p.active_routed, 2 * 48);
  EXPECT_DOUBLE_EQ(p.shared_experts, 72);  // 3*8*3
  EXPECT_DOUBLE_EQ(p.router, 32 + 8);      // router 8*4 + shared-expert gate 8
  EXPECT_DOUBLE_EQ(p.norms, 16);
  // Latent MoE (moe_latent_size 4): experts 4 -> 2 -> 4, two projections 8 x 4; the rest unchanged.
  json cfg = hybrid_toy();
  cfg["moe_latent_size"] = 4;
  const ModelSpec lm = model_from_hf_config(cfg, "toy");
  const LayerParams lp = layer_params(lm, lm.layers[1]);
  EXPECT_DOUBLE_EQ(lp.routed_experts, 4 * 24);  // one expert 3*4*2 = 24
  EXPECT_DOUBLE_EQ(lp.latent_proj, 2 * 8 * 4);
  EXPECT_DOUBLE_EQ(lp.shared_experts, p.shared_experts);
  EXPECT_DOUBLE_EQ(lp.total(), p.total() - 4 * 48 + 4 * 24 + 64);
}

TEST(ToyParams, HybridModelTotalsAndMtp) {
  const ParamCounts c = count_params(model_from_hf_config(hybrid_toy(), "toy"));
  // layer 0: 496 + 11 + 192 + 72 + 40 + 16 = 827; layer 1: 512 + 8 + 192 + 72 + 40 + 16 = 840
  EXPECT_DOUBLE_EQ(c.total, 827 + 840 + 168);
  // active swaps the 4 routed experts (192) for the top-2 (96) in both layers
  EXPECT_DOUBLE_EQ(c.active, 731 + 744 + 168);
  // MTP: a copy of the last layer (840) + eh_proj 2*8*8 = 128 + three norms 24
  EXPECT_DOUBLE_EQ(c.mtp, 992);
  EXPECT_DOUBLE_EQ(c.total_with_mtp, c.total + 992);
}

// DeepSeek-V3 style: layer 0 dense (first_k_dense_replace 1), layer 1 MoE with one shared expert and sigmoid router.
json mla_toy() {
  return json::parse(R"({"model_type": "deepseek_v3", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "num_attention_heads": 2, "q_lora_rank": 4, "kv_lora_rank": 3, "qk_nope_head_dim": 2, "qk_rope_head_dim": 1,
    "v_head_dim": 2, "intermediate_size": 6, "first_k_dense_replace": 1, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 2, "n_shared_experts": 1, "scoring_func": "sigmoid",
    "n_group": 2, "topk_group": 1, "num_nextn_predict_layers": 1, "tie_word_embeddings": false})");
}

TEST(ToyParams, MlaWithQueryLora) {
  const ModelSpec m = model_from_hf_config(mla_toy(), "toy");
  const LayerParams p = layer_params(m, m.layers[0]);
  // q_a 8*4 = 32, q_b 4*2*(2+1) = 24, kv_a 8*(3+1) = 32, kv_b 3*2*(2+2) = 24, o 2*2*8 = 32; the down-projections
  // q_a and kv_a and their layernorms are whole on every TP rank (Megatron-LM: parallel_mode "duplicated")
  EXPECT_DOUBLE_EQ(p.mixer, 24 + 24 + 32);
  EXPECT_DOUBLE_EQ(p.mixer_replicated, 32 + 4 + 32 + 3);
  const ParamCounts c = count_params(m);
  // layer 0: 144 + 7 + dense 3*8*6 = 144 + 16 = 311; layer 1: 144 + 7 + experts 192 + shared 48 + router 8*4 + 4 bias + 16 = 443
  EXPECT_DOUBLE_EQ(c.total, 311 + 443 + 168);
  EXPECT_DOUBLE_EQ(c.active, 311 + (443 - 192 + 96) + 168);
  EXPECT_DOUBLE_EQ(c.mtp, 443 + 128 + 24);  // MTP copies the last (MoE) layer
}

TEST(ToyParams, MlaWithoutQueryLora) {
  json cfg = mla_toy();
  cfg["q_lora_rank"] = nullptr;  // Moonlight: queries projected directly
  const ModelSpec m = model_from_hf_config(cfg, "toy");
  EXPECT_EQ(m.mla.q_lora_rank, 0);
  const LayerParams p = layer_params(m, m.layers[0]);
  // q 8*2*3 = 48 (column-parallel) replaces q_a + q_b; kv_a and its layernorm remain replicated
  EXPECT_DOUBLE_EQ(p.mixer, 48 + 24 + 32);
  EXPECT_DOUBLE_EQ(p.mixer_replicated, 32 + 3);
  EXPECT_DOUBLE_EQ(count_params(m).total, 922 - 2 * 12);
}

TEST(ToyParams, GptOssBiasesSinksAndSlidingLayers) {
  const json cfg = json::parse(R"({"model_type": "gpt_oss", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 2, "num_local_experts": 4, "experts_per_token": 2, "intermediate_size": 3,
    "attention_bias": true, "tie_word_embeddings": false})");
  const ModelSpec m = model_from_hf_config(cfg, "toy");
  EXPECT_TRUE(m.layers[0].sliding);
  EXPECT_FALSE(m.layers[1].sliding);
  const ParamCounts c = count_params(m);
  // attention: q 64+8, k 32+4, v 32+4, o 64+8, sinks 4 = 220; expert 3*8*3 + biases (2*3 + 8) = 86, router 8*4 + 4
  // layer: 220 + 4*86 + 36 + 16 = 616
  EXPECT_DOUBLE_EQ(c.total, 2 * 616 + 168);
  EXPECT_DOUBLE_EQ(c.active, 2 * (616 - 4 * 86 + 2 * 86) + 168);
}

TEST(ToyParams, MixtralExpertsUseIntermediateSize) {
  const json cfg = json::parse(R"({"model_type": "mixtral", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
    "intermediate_size": 3, "tie_word_embeddings": false})");
  const ParamCounts c = count_params(model_from_hf_config(cfg, "toy"));
  // layer: attention 192 + experts 4*(3*8*3) = 288 + router 32 + norms 16 = 528
  EXPECT_DOUBLE_EQ(c.total, 2 * 528 + 168);
  EXPECT_DOUBLE_EQ(c.active, 2 * (528 - 288 + 144) + 168);
}

TEST(ToyParams, Qwen3MoeDenseLayerAndQkNorm) {
  const json cfg = json::parse(R"({"model_type": "qwen3_moe", "hidden_size": 8, "vocab_size": 10, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 6, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 2, "mlp_only_layers": [0], "tie_word_embeddings": false})");
  const ParamCounts c = count_params(model_from_hf_config(cfg, "toy"));
  // layer 0: attention 192 + qk norms 4 + SwiGLU 144 + norms 16 = 356; layer 1: 192 + 4 + experts 192 + router 32 + 16 = 436
  EXPECT_DOUBLE_EQ(c.total, 356 + 436 + 168);
  EXPECT_DOUBLE_EQ(c.active, 356 + (436 - 96) + 168);
}

}  // namespace
}  // namespace lcplan
