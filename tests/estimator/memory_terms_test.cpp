// Every memory term on the 2-layer toy model, counted by hand.
//
// Parameters (toy_model.h): attention q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; dense SwiGLU 3x64x128 = 24,576;
// experts 4 x 3x64x32 = 24,576; router 64x4 = 256; norms 2x64 per layer; embedding and LM head 1000x64 = 64,000 each;
// final norm 64.  Layer 0 = 36,992, layer 1 = 37,248, total 202,304; expert 24,576, dense 177,728.
//
// Activations, seq 128, micro batch 1, tp = cp = 1 (bf16 = 2 bytes):
//   layer input 2*128*64 = 16,384; attention: norm out 16,384, q+k+v 2*128*(64+32+32) = 32,768,
//   output 2*128*64 = 16,384, log-sum-exp 4*128*4 = 2,048 -> 67,584 with the norm;
//   dense FFN: norm out 16,384, fc1 2*128*256 = 65,536, act 2*128*128 = 32,768 -> 114,688;
//   MoE FFN (256 routed copies = 128 tokens x top-2): norm out 16,384, router 2*4*128*4 = 4,096,
//   dispatched 2*256*64 = 32,768, expert output 32,768, fc1 2*256*64 = 32,768, act 2*256*32 = 16,384 -> 135,168.
//   Layer 0 = 16,384 + 67,584 + 114,688 = 198,656; layer 1 = 16,384 + 67,584 + 135,168 = 219,136.
#include <gtest/gtest.h>

#include "estimator/derived_plan.h"
#include "estimator/memory_model.h"
#include "estimator/plan_rules.h"
#include "models/params.h"
#include "tests/common/toy_model.h"

using namespace lcplan;
using lcplan::testing::bare_calibration;
using lcplan::testing::toy_hardware;
using lcplan::testing::toy_model;
using lcplan::testing::toy_plan;
using lcplan::testing::at;


TEST(MemoryTerms, ParameterCountsByHand) {
  const ParamCounts c = count_params(toy_model());
  EXPECT_DOUBLE_EQ(c.total, 202304);
  EXPECT_DOUBLE_EQ(c.routed_experts, 24576);
  // Active: layer 1 touches 2 of 4 experts (12,288 of 24,576).
  EXPECT_DOUBLE_EQ(c.active, 202304 - 12288);
}

TEST(MemoryTerms, StaticUnderEachSharding) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  ASSERT_FALSE(check_plan(m, p));
  const Calibration cal = bare_calibration();
  // none: 2 + 4 + 12 bytes per parameter.
  p.optimizer_sharding = OptimizerSharding::None;
  MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).params, 2 * 202304.0);
  EXPECT_DOUBLE_EQ(at(e, 0).grads, 4 * 202304.0);
  EXPECT_DOUBLE_EQ(at(e, 0).optimizer, 12 * 202304.0);
  // dist_opt over dp*cp = 2 (dense) and expert-dp = 2: 12 * (177,728 + 24,576) / 2.
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).params, 2 * 202304.0);
  EXPECT_DOUBLE_EQ(at(e, 0).optimizer, 12 * 101152.0);
  // fsdp: all 18 bytes over 2 ranks, plus the largest unit (the 64,000-parameter tables) gathered twice (current +
  // prefetch, bf16) and its fp32 gradient in backward.
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).params, 2 * 101152.0);
  EXPECT_DOUBLE_EQ(at(e, 0).grads, 4 * 101152.0);
  EXPECT_DOUBLE_EQ(at(e, 0).optimizer, 12 * 101152.0);
  EXPECT_EQ(e.stages[0].peak_phase, Phase::Loss);
  EXPECT_DOUBLE_EQ(at(e, 0).fsdp_buffers, 2 * 2 * 64000.0);
  // Optimizer offload removes the optimizer term and nothing else.
  p.offload.optimizer = true;
  const MemoryEstimate off = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(off, 0).optimizer, 0);
  EXPECT_DOUBLE_EQ(at(off, 0).params, at(e, 0).params);
}

TEST(MemoryTerms, ActivationsAndLogitsByHand) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const Calibration cal = bare_calibration();
  const LayerActivation a0 = layer_activation(m, p, m.layers[0], false);
  const LayerActivation a1 = layer_activation(m, p, m.layers[1], false);
  // Each layer keeps the residual after its mixer (the pre-FFN norm's input, 2 x 128 x 64 = 16,384) beside what the
  // dense layer's 198,656 and the MoE layer's 186,368 below count (lcplan-exec rebuilds that norm's output instead).
  EXPECT_DOUBLE_EQ(a0.full, 198656 + 16384);
  Plan rebuilds_norm = p;
  rebuilds_norm.implementation = "lcplan-exec";
  EXPECT_DOUBLE_EQ(layer_activation(m, rebuilds_norm, m.layers[0], false).full, 198656);
  // Megatron-LM applies the routing weights in the experts' activation; a framework whose combine weights the copies
  // (the article's) keeps the experts' output for the weights' gradient: 2 x 256 copies x 64 more.
  EXPECT_DOUBLE_EQ(a1.full, 186368 + 16384);
  EXPECT_DOUBLE_EQ(a1.moe_tokens, 32768 * 2 + 16384);
  Plan weighted_combine = p;
  weighted_combine.implementation = "bumblebee";
  EXPECT_DOUBLE_EQ(layer_activation(m, weighted_combine, m.layers[1], false).full, 186368 + 16384 + 32768);
  EXPECT_DOUBLE_EQ(layer_activation(m, weighted_combine, m.layers[1], false).moe_tokens, 32768 * 3 + 16384);
  const MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  // Peak is the loss: saved activations of both layers + fp32 logits 128 x 1000 x 4.
  EXPECT_EQ(e.peak_phase, Phase::Loss);
  EXPECT_DOUBLE_EQ(at(e, 0).activations, 198656 + 186368 + 2 * 16384);
  EXPECT_DOUBLE_EQ(at(e, 0).logits, 128 * 1000 * 4.0);
  // Linear CE: a 100-column bf16 tile, four fp32 per-token statistics and the fp32 d_hidden.
  p.linear_ce = true;
  const MemoryEstimate l = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(l, 0).logits, 128 * 100 * 2.0 + 128 * 4 * 4.0 + 128 * 64 * 4.0);
  Calibration big_tile = cal;
  big_tile.linear_ce_vocab_tile = 2000;  // larger than the vocabulary: the tile is the whole (local) vocabulary
  const MemoryEstimate lt = estimate_memory(m, p, toy_hardware(), big_tile);
  EXPECT_LE(lt.peak_bytes, estimate_memory(m, toy_plan(), toy_hardware(), big_tile).peak_bytes);
}

TEST(MemoryTerms, SelectiveAndFullRecompute) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.recompute = Recompute::Selective;
  // Selective (core_attn, layernorm, moe_act) drops the log-sum-exp (2,048) and, where they are modules of their own,
  // the norms' outputs (16,384 each) and MLP activations; it keeps the norms' inputs. Megatron-LM fuses the dense
  // layer's norms into the linears after them and rebuilds only the experts' activation; the article's framework
  // (whose MoE layer also keeps the experts' output, 32,768) rebuilds every norm and activation.
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).saved, 198656 + 16384 - 2048);
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[1], false).saved, 186368 + 16384 - 16384 - 2048 - 16384);
  Plan own_modules = p;
  own_modules.implementation = "bumblebee";
  EXPECT_DOUBLE_EQ(layer_activation(m, own_modules, m.layers[0], false).saved, 198656 + 16384 - 2 * 16384 - 2048 - 32768);
  EXPECT_DOUBLE_EQ(layer_activation(m, own_modules, m.layers[1], false).saved,
                   186368 + 16384 + 32768 - 2 * 16384 - 2048 - 16384);
  p.recompute = Recompute::Full;
  Calibration cal = bare_calibration();
  p.linear_ce = true;
  const MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  // Full: only the two layer inputs stay; backward rematerializes the larger layer (198,656 + 16,384 - its input).
  EXPECT_EQ(e.peak_phase, Phase::Backward);
  EXPECT_DOUBLE_EQ(at(e, 0).activations, 2 * 16384 + 198656);
  // recompute_layers = 1 (block method): layer 0 recomputed, layer 1 keeps everything.
  p.recompute_layers = 1;
  const MemoryEstimate b = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(b, 0).activations, 16384 + (186368 + 16384) + 198656);
}

TEST(MemoryTerms, MoeBuffersScaleWithChunksAndImbalance) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.linear_ce = true;
  Calibration cal = bare_calibration();
  cal.moe_buffer_copies = 4;
  MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).moe_buffers, 4 * 2 * 256 * 64.0);
  p.moe.routing_imbalance = 1.5;
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).moe_buffers, 1.5 * 4 * 2 * 256 * 64.0);
  p.moe.capacity_factor = 1.25;  // token dropping caps the busiest rank at the capacity
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).moe_buffers, 1.25 * 4 * 2 * 256 * 64.0);
  p.moe = {};
  p.moe.ep_chunks = 2;
  cal.moe_chunk_overlap = 0;
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).moe_buffers, 0.5 * 4 * 2 * 256 * 64.0);
  cal.moe_chunk_overlap = 0.5;
  e = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(at(e, 0).moe_buffers, 0.75 * 4 * 2 * 256 * 64.0);
}

// One MoE layer by itself (Megatron-LM's moe_perf benchmark): the MoE layer's router 256 and experts 24,576 at 2 + 4
// bytes = 148,992; the MoE FFN's saved 102,400 (above; its norm output is the layer's input); output and input
// gradient 2*2*128*64 = 32,768; 4 buffers 4*2*256*64 = 131,072; the fc1 output's gradient 2*256*2*32 = 32,768.
TEST(MemoryTerms, OneMoeLayerByHand) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  Calibration cal = bare_calibration();
  cal.moe_buffer_copies = 4;
  EXPECT_DOUBLE_EQ(moe_layer_peak_bytes(derive_plan(m, p, toy_hardware()), cal),
                   148992.0 + 102400 + 32768 + 131072 + 32768);
  // Recomputing the MoE layer's activation drops its saved act (2*256*32) from the layer's own forward.
  p.recompute = Recompute::Selective;
  p.recompute_modules = kRecomputeMoeAct;
  EXPECT_DOUBLE_EQ(moe_layer_peak_bytes(derive_plan(m, p, toy_hardware()), cal),
                   148992.0 + 102400 - 16384 + 32768 + 131072 + 32768);
  ModelSpec dense = m;
  for (LayerSpec& l : dense.layers) l.ffn = FfnKind::Dense;
  EXPECT_DOUBLE_EQ(moe_layer_peak_bytes(derive_plan(dense, p, toy_hardware()), cal), 0);
}

TEST(MemoryTerms, PipelineStagesAndInflightMicrobatches) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.gpus = 4;
  p.parallel.pp = 2;
  p.optimizer_sharding = OptimizerSharding::None;
  ASSERT_FALSE(check_plan(m, p));
  const Calibration cal = bare_calibration();
  const MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  ASSERT_EQ(e.stages.size(), 2u);
  // Stage 0: layer 0 + embedding; stage 1: layer 1 + LM head + final norm.
  EXPECT_DOUBLE_EQ(at(e, 0).params, 2 * (36992 + 64000.0));
  EXPECT_DOUBLE_EQ(at(e, 1).params, 2 * (37248 + 64000 + 64.0));
  // 1F1B: stage 0 holds pp - 0 = 2 microbatches (default global batch gives 2), stage 1 holds 1.
  EXPECT_DOUBLE_EQ(e.stages[0].inflight_microbatches, 2);
  EXPECT_DOUBLE_EQ(e.stages[1].inflight_microbatches, 1);
  EXPECT_DOUBLE_EQ(at(e, 0).activations, 2 * (198656.0 + 16384));
  EXPECT_EQ(e.stages[1].peak_phase, Phase::Loss);
  EXPECT_DOUBLE_EQ(at(e, 1).logits, 128 * 1000 * 4.0);
  EXPECT_DOUBLE_EQ(at(e, 0).logits, 0);
  // With a single microbatch per step nothing more than one can be in flight.
  p.global_batch = 2;
  EXPECT_DOUBLE_EQ(estimate_memory(m, p, toy_hardware(), cal).stages[0].inflight_microbatches, 1);
}

TEST(MemoryTerms, TensorAndContextParallelShrinkPerRankActivations) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const double base = layer_activation(m, p, m.layers[0], false).full;
  p.gpus = 4;
  p.parallel.tp = 2;  // with sequence parallelism every tensor is split in two
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).full, base / 2);
  p.parallel.tp = 1;
  p.parallel.cp = 2;
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).full, base / 2);
}

TEST(MemoryTerms, WorkspaceContextAndFragmentation) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  Calibration cal = bare_calibration();
  cal.workspace_bytes = 1000;
  cal.nccl_bytes_per_group = 100;
  cal.cuda_context_bytes = 7;
  cal.fragmentation = 0.5;
  const MemoryEstimate e = estimate_memory(m, p, toy_hardware(), cal);
  // Groups with more than one rank: dp*cp (2) and expert-dp (2).
  EXPECT_DOUBLE_EQ(at(e, 0).workspace, 1000 + 2 * 100);
  EXPECT_DOUBLE_EQ(at(e, 0).cuda_context, 7);
  const MemoryBreakdown& b = at(e, 0);
  EXPECT_DOUBLE_EQ(b.fragmentation, 0.5 * (b.activations + b.logits + b.moe_buffers + b.fsdp_buffers));
  EXPECT_DOUBLE_EQ(e.peak_bytes, b.total());
}
