// FLOPs accounting against toy models counted by hand (counts in the comments).
#include <gtest/gtest.h>

#include "estimator/flops.h"

namespace lcplan {
namespace {

// hidden 4, vocab 10; GQA 2 heads / 1 KV head of dim 2; SwiGLU ffn 8.
ModelSpec dense_toy() {
  ModelSpec m;
  m.hidden = 4;
  m.vocab = 10;
  m.dense_ffn = 8;
  m.attn.heads = 2;
  m.attn.kv_heads = 1;
  m.attn.head_dim = 2;
  m.layers = {{MixerKind::FullAttention, FfnKind::Dense, false}};
  return m;
}

TEST(Flops, DenseToyByHand) {
  const ModelSpec m = dense_toy();
  const LayerFlops f = layer_forward_flops(m, m.layers[0], 8);
  // Projections: q 4x4, k 4x2, v 4x2, o 4x4 = 48 weights -> 96 FLOPs/token x 8 tokens.
  EXPECT_DOUBLE_EQ(f.proj, 768);
  // Causal core: QK^T and PV each 8*8/2 query-key pairs x head_dim 2 x 2 heads x 2 FLOPs = 256 -> 512.
  EXPECT_DOUBLE_EQ(f.attn_core, 512);
  // SwiGLU: 3 x 4 x 8 = 96 weights -> 192 FLOPs/token x 8.
  EXPECT_DOUBLE_EQ(f.dense_mlp, 1536);
  EXPECT_DOUBLE_EQ(lm_head_forward_flops(m, 8), 640);  // 2 x 4 x 10 x 8
  EXPECT_DOUBLE_EQ(model_forward_flops(m, 8), 768 + 512 + 1536 + 640);
  Plan p;
  p.gpus = 1;
  p.seq_len = 8;
  p.global_batch = 2;
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, p), 3.0 * 2 * 3456);  // fwd + 2x bwd, 2 sequences, no recompute
}

TEST(Flops, CausalIsHalfTheSquareAndQuadratic) {
  const ModelSpec m = dense_toy();
  const double a = layer_forward_flops(m, m.layers[0], 1024).attn_core;
  const double b = layer_forward_flops(m, m.layers[0], 2048).attn_core;
  EXPECT_DOUBLE_EQ(b / a, 4.0);
  EXPECT_DOUBLE_EQ(a, 4.0 * 4 * 1024 * 1024 / 2);  // 4 x q_dim x s x s/2
}

TEST(Flops, SlidingWindowCountsTheBand) {
  ModelSpec m = dense_toy();
  m.attn.sliding_window = 2;
  LayerSpec l{MixerKind::FullAttention, FfnKind::Dense, true};
  // Band of a causal window 2 over 8 tokens: s*w - w^2/2 = 14 query-key pairs (continuous count, = s^2/2 at w = s).
  EXPECT_DOUBLE_EQ(causal_context(8, 2) * 8, 14);
  EXPECT_DOUBLE_EQ(layer_forward_flops(m, l, 8).attn_core, 4.0 * 4 * 14);
  // A window wider than the sequence is plain causal attention; long sequences grow linearly, not quadratically.
  EXPECT_DOUBLE_EQ(causal_context(8, 100), 4);
  const double x = layer_forward_flops(m, l, 4096).attn_core, y = layer_forward_flops(m, l, 8192).attn_core;
  EXPECT_NEAR(y / x, 2.0, 1e-3);
}

TEST(Flops, GatedDeltaNetIsLinearInSequence) {
  ModelSpec m;
  m.hidden = 4;
  m.vocab = 10;
  m.linear = {1, 2, 2, 2, 4};  // 1 key head, 2 value heads, dk = dv = 2, conv 4
  LayerSpec l{MixerKind::LinearAttention, FfnKind::Dense, false};
  m.dense_ffn = 8;
  const LayerFlops f = layer_forward_flops(m, l, 10);
  // in_proj qkvz 4 x (2*2 + 2*4) = 48, ba 4 x 2 x 2 = 16, out_proj 4 x 4 = 16: 80 weights -> 160 FLOPs/token.
  EXPECT_DOUBLE_EQ(f.proj, 1600);
  // Per value head 2*64*(3*2 + 2*2) + 6*2*2 = 1304, x 2 heads, + conv 2*4*(2*2 + 4) = 64: 2672 FLOPs/token.
  EXPECT_DOUBLE_EQ(f.linear_core, 26720);
  EXPECT_DOUBLE_EQ(f.attn_core, 0);
  EXPECT_DOUBLE_EQ(layer_forward_flops(m, l, 20).linear_core, 2 * f.linear_core);
}

TEST(Flops, MlaByHand) {
  ModelSpec m;
  m.hidden = 8;
  m.vocab = 10;
  m.mla = {2, 4, 3, 2, 1, 2};  // heads 2, q_lora 4, kv_lora 3, qk_nope 2, qk_rope 1, v 2
  LayerSpec l{MixerKind::MLA, FfnKind::Dense, false};
  m.dense_ffn = 1;
  const LayerFlops f = layer_forward_flops(m, l, 4);
  // q_a 8x4 = 32, q_b 4x(2*3) = 24, kv_a 8x(3+1) = 32, kv_b 3x(2*(2+2)) = 24, o 2*2 x 8 = 32: 144 weights.
  EXPECT_DOUBLE_EQ(f.proj, 4 * 2 * 144);
  // Core: 2 heads x (qk 3 + v 2) x 2 FLOPs x ctx 2 per token, 4 tokens.
  EXPECT_DOUBLE_EQ(f.attn_core, 4 * 2 * 2 * 5 * 2);
}

TEST(Flops, MoeTopKSharedAndCapacity) {
  ModelSpec m;
  m.hidden = 4;
  m.vocab = 10;
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 3;
  m.moe.shared_experts = 1;
  m.moe.shared_ffn = 2;
  m.attn = {2, 1, 2};
  LayerSpec l{MixerKind::FullAttention, FfnKind::MoE, false};
  const LayerFlops f = layer_forward_flops(m, l, 1);
  EXPECT_DOUBLE_EQ(f.router, 2 * 4 * 4);         // h x E
  EXPECT_DOUBLE_EQ(f.routed, 2 * (2 * 3 * 4 * 3));  // top_k x SwiGLU(4 -> 3)
  EXPECT_DOUBLE_EQ(f.shared, 2 * 3 * 4 * 2);
  EXPECT_DOUBLE_EQ(f.dense_mlp, 0);
  // Token dropping pads experts to capacity: executed routed work scales by the capacity factor.
  EXPECT_DOUBLE_EQ(layer_forward_flops(m, l, 1, 1.25).routed, 1.25 * f.routed);
  // Latent MoE as Megatron-LM counts it: the experts on the latent width plus its two projections (2 x h x latent).
  m.moe.latent = 2;
  const LayerFlops lat = layer_forward_flops(m, l, 1);
  EXPECT_DOUBLE_EQ(lat.routed, 2 * (2 * 3 * 2 * 3));  // top_k x SwiGLU(2 -> 3)
  EXPECT_DOUBLE_EQ(lat.latent, 2 * (2 * 4 * 2));      // down 4 -> 2 and up 2 -> 4
  EXPECT_DOUBLE_EQ(lat.router, f.router);             // the router reads the hidden width
  EXPECT_DOUBLE_EQ(lat.shared, f.shared);             // as do the shared experts
  EXPECT_DOUBLE_EQ(lat.total(), f.total() - f.routed + lat.routed + lat.latent);
}

TEST(Flops, MtpAddsProjectionLayerAndHead) {
  ModelSpec m = dense_toy();
  const double base = model_forward_flops(m, 8);
  m.mtp_layers = 1;
  // eh_proj 2h x h = 32 weights -> 64 FLOPs/token, + one decoder layer (2816) + LM head (640).
  EXPECT_DOUBLE_EQ(mtp_forward_flops(m, 8), 8 * 64 + 2816 + 640);
  EXPECT_DOUBLE_EQ(model_forward_flops(m, 8), base + 8 * 64 + 2816 + 640);
}

}  // namespace
}  // namespace lcplan
