// The run settings' physics (estimator/run_settings.h, estimator/run_physics.h), each against a number its public
// source gives: byte counts on the toy model (tests/common/toy_model.h, counted by hand in memory_terms_test.cpp),
// time effects on zoo models under the default profile.
#include <gtest/gtest.h>

#include "common/data_dir.h"
#include "estimator/estimate.h"
#include "estimator/frameworks.h"
#include "estimator/plan_rules.h"
#include "estimator/run_physics.h"
#include "estimator/time_model.h"
#include "models/zoo.h"
#include "tests/common/toy_model.h"
#include "tests/common/zoo_profile.h"

using namespace lcplan;
using lcplan::testing::bare_calibration;
using lcplan::testing::toy_hardware;
using lcplan::testing::toy_model;
using lcplan::testing::toy_plan;
using lcplan::testing::at;
using lcplan::testing::zoo_plan;

namespace {


struct Zoo : ::testing::Test, lcplan::testing::ZooProfile {
  TimeEstimate time(const ModelSpec& m, const Plan& p) const {
    EXPECT_FALSE(check_plan(m, p)) << check_plan(m, p)->message;
    return estimate_time(m, p, hw, cal(p));
  }
  MemoryEstimate memory(const ModelSpec& m, const Plan& p) const { return estimate_memory(m, p, hw, cal(p)); }
};

}  // namespace

// Megatron-LM param_and_grad_buffer.py: the grad buffer is fp32 with grad_reduce_in_fp32, else the parameters' bf16.
TEST(RunSettings, Bf16GradientReductionHalvesTheGradientBuffer) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const MemoryEstimate fp32 = estimate_memory(m, p, toy_hardware(), bare_calibration());
  p.optimizer.grad = Dtype::BF16;
  const MemoryEstimate bf16 = estimate_memory(m, p, toy_hardware(), bare_calibration());
  EXPECT_DOUBLE_EQ(at(fp32, 0).grads, 4 * 202304.0);
  EXPECT_DOUBLE_EQ(at(bf16, 0).grads, 2 * 202304.0);
  EXPECT_DOUBLE_EQ(at(bf16, 0).params, at(fp32, 0).params);
}

// Megatron-LM docs/user-guide/features/dist_optimizer.md: bf16 parameters with fp32 gradients take 6 + 12/d bytes per
// parameter under the distributed optimizer (d = data-parallel size).
TEST(RunSettings, DistributedOptimizerBytesPerParameter) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const MemoryEstimate e = estimate_memory(m, p, toy_hardware(), bare_calibration());
  const MemoryBreakdown& b = at(e, 0);
  EXPECT_DOUBLE_EQ(b.params + b.grads + b.optimizer, (6 + 12.0 / 2) * 202304);
}

// megatron-settings.md section 1 (DistributedDataParallelConfig num_distributed_optimizer_instances): the distributed
// optimizer sharded over DP / N ranks keeps N copies of the state, N times its memory, and adds a gradient all-reduce
// across the instances; params and grads stay whole. One instance is the plain distributed optimizer.
TEST_F(Zoo, DistOptInstancesMultiplyTheOptimizerState) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 64, 4096);
  p.parallel.ep = 8;
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  const MemoryBreakdown one = memory(m, p).stages[0].breakdown;
  const TimeEstimate t1 = time(m, p);
  p.optimizer.instances = 4;
  const MemoryBreakdown four = memory(m, p).stages[0].breakdown;
  EXPECT_NEAR(four.optimizer, 4 * one.optimizer, 1e-6 * one.optimizer);
  EXPECT_DOUBLE_EQ(four.params, one.params);
  EXPECT_DOUBLE_EQ(four.grads, one.grads);
  // Without overlap the gradient sync is exposed: the cross-instance all-reduce adds to it.
  Plan eager = p;
  eager.comm.overlap_grad_reduce = eager.comm.overlap_param_gather = false;
  Plan eager1 = eager;
  eager1.optimizer.instances = 1;
  EXPECT_GT(time(m, eager).breakdown.exposed_comm.dp_fsdp, time(m, eager1).breakdown.exposed_comm.dp_fsdp);
  EXPECT_GT(time(m, p).breakdown.optimizer, t1.breakdown.optimizer);  // each rank updates a 4x larger shard
  p.optimizer.instances = 3;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("must divide"), std::string::npos) << check_plan(m, p)->message;
  p.optimizer.instances = 2, p.optimizer_sharding = OptimizerSharding::Fsdp;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("dist_opt"), std::string::npos) << check_plan(m, p)->message;
}

// megatron-settings.md section 7 (--microbatch-group-size-per-virtual-pipeline-stage, default pp): a larger group
// warms up (vpp - 1) more microbatches per extra group member (schedules.py get_pp_rank_microbatches), so the first
// stage holds more activations at its peak; the bubble is the interleaved one either way. A group below pp, or
// without virtual stages, is refused in one sentence.
TEST_F(Zoo, ALargerMicrobatchGroupHoldsMoreActivations) {
  const ModelSpec m = load_model("llama-3.1-8b", data_dir());
  Plan p = zoo_plan("llama-3.1-8b", 8, 4096);
  p.parallel.pp = 4, p.parallel.vpp = 2, p.global_batch = 32;  // dp 2: 16 microbatches
  const StageMemory depth = memory(m, p).stages[0];
  p.microbatch_group = 16;  // breadth-first: every microbatch of the step in one group
  ASSERT_EQ(check_plan(m, p), std::nullopt);
  const StageMemory breadth = memory(m, p).stages[0];
  // Stage 0 of 4 with 2 chunks: depth-first holds 7 + 4 microbatches (11 of 16 layers' worth per chunk pair),
  // breadth-first 16 + 7 (2 x 3 + 16 warmup forwards plus one, in table order).
  EXPECT_DOUBLE_EQ(depth.inflight_microbatches, (7 + 4) / 2.0);
  EXPECT_DOUBLE_EQ(breadth.inflight_microbatches, (16 + 7) / 2.0);
  EXPECT_NEAR(breadth.terms.saved_activations / depth.terms.saved_activations, 23.0 / 11, 1e-9);
  EXPECT_DOUBLE_EQ(time(m, p).breakdown.bubble, [&] { Plan d = p; d.microbatch_group = 0; return time(m, d).breakdown.bubble; }());
  p.microbatch_group = 4;  // pp itself: the default
  EXPECT_DOUBLE_EQ(memory(m, p).stages[0].terms.saved_activations, depth.terms.saved_activations);
  p.microbatch_group = 2;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("microbatch_group = 2 is out of range (valid: 0 for pp, or pp = 4 up to the step's 16"),
            std::string::npos) << check_plan(m, p)->message;
  p.microbatch_group = 32;
  ASSERT_TRUE(check_plan(m, p));
  p.microbatch_group = 4, p.parallel.vpp = 1;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("vpp = 1"), std::string::npos) << check_plan(m, p)->message;
}

// megatron-settings.md section 2 (--distribute-saved-activations; tensor_parallel/random.py CheckpointFunction):
// without sequence parallelism each TP rank keeps the whole layer input as full recompute's checkpoint; distributed,
// it keeps 1/tp of it and all-gathers it over TP before the replay, once per checkpoint.
TEST_F(Zoo, DistributedCheckpointsKeepATpSliceOfTheLayerInput) {
  const ModelSpec m = load_model("llama-3.1-70b", data_dir());
  Plan p = zoo_plan("llama-3.1-70b", 32, 8192);
  p.parallel.tp = 8, p.parallel.pp = 4, p.sequence_parallel = false, p.recompute = Recompute::Full;
  const StageMemory whole = memory(m, p).stages[0];
  const TimeEstimate t_whole = time(m, p);
  p.distribute_saved_activations = true;
  ASSERT_EQ(check_plan(m, p), std::nullopt);
  const StageMemory split = memory(m, p).stages[0];
  EXPECT_NEAR(split.terms.saved_activations, whole.terms.saved_activations / 8, 1e-9 * whole.terms.saved_activations);
  // Each of the 80 layers' replays first gathers its 8192 x 8192 bf16 input over 8 ranks: the TP time grows by
  // 80 x microbatches of those all-gathers, and no other term moves.
  const TimeEstimate t_split = time(m, p);
  const double gather = collective_seconds(Collective::AllGather, 8192.0 * 8192 * 2, 8, LinkTier::NVLink, 1, hw, cal(p));
  EXPECT_NEAR(t_split.breakdown.exposed_comm.tp - t_whole.breakdown.exposed_comm.tp,
              80.0 * num_microbatches(p) * gather / 4, 1e-6 * t_split.step_seconds);  // one stage's 20 layers
  EXPECT_DOUBLE_EQ(t_split.breakdown.compute, t_whole.breakdown.compute);
  p.sequence_parallel = true;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("sequence_parallel = false"), std::string::npos) << check_plan(m, p)->message;
  p.sequence_parallel = false, p.recompute = Recompute::Selective;
  ASSERT_TRUE(check_plan(m, p));
}

// Megatron-LM MoE README: bf16 optimizer states reduce optimizer memory by 50% (DeepSeek-V3's precision-aware
// optimizer: bf16 moments, the fp32 master stored as an int16 remainder beside the bf16 weight).
TEST(RunSettings, PrecisionAwareOptimizerHalvesOptimizerMemory) {
  Plan p = toy_plan();
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(p), 12);
  p.optimizer = {Dtype::FP32, Dtype::FP32, Dtype::BF16, Dtype::BF16, true};
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(p), 6);
  // No remainder with the tensorwise fp8 recipe (distrib_optimizer.py: no fp8, or the delayed recipe).
  p.precision = Precision::FP8;
  p.fp8.recipe = Fp8Recipe::Tensorwise;
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(p), 8);
  p.fp8.recipe = Fp8Recipe::Delayed;
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(p), 6);
  // fp8 moments (--exp-avg-dtype fp8): one byte each.
  p.optimizer.exp_avg = p.optimizer.exp_avg_sq = Dtype::FP8;
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_param(p), 4);
  // Other dtypes need the precision-aware optimizer (optimizer_config.py).
  p.optimizer.precision_aware = false;
  EXPECT_EQ(check_plan(toy_model(), p)->rule, Rule::RunSettings);
}

// Megatron-Bridge docs/training/cpu-offloading.md: on Qwen3-30B-A3B with TP 2, PP 2, EP 4 each 25% of
// --optimizer-offload-fraction saves the same 3.8 GB (15.3 GB at 100%): the saving is linear in the fraction.
TEST_F(Zoo, OptimizerOffloadFractionSavesItsShareOfTheState) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 16, 4096);
  p.parallel = {2, 2, 1, 1, 4, 1};
  p.optimizer.precision_aware = true;
  const double full = memory(m, p).stages[0].breakdown.optimizer;
  p.offload.optimizer = true;
  double prev = full;
  for (double f : {0.25, 0.5, 0.75, 1.0}) {
    p.offload.optimizer_fraction = f;
    const double left = memory(m, p).stages[0].breakdown.optimizer;
    EXPECT_NEAR(prev - left, full / 4, 1e-6 * full) << f;
    prev = left;
  }
  EXPECT_DOUBLE_EQ(prev, 0);
  // The state of this layout is of the measurement's size: 15.3 GB at 100% within 25% (the run's GPU count is not
  // stated; 16 GPUs is the smallest that holds EP 4 with TP 2 and PP 2).
  EXPECT_NEAR(full / 1e9, 15.3, 0.25 * 15.3);
}

// CUDA graphs replay their kernels without host launches (Megatron-Bridge docs/training/cuda-graphs.md): a full
// iteration graph removes the per-kernel launch term; attention graphs remove the attention part of it.
TEST_F(Zoo, FullIterationGraphsRemoveTheLaunchTerm) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 8, 4096);
  p.parallel.ep = 8;
  p.moe.capacity_factor = 1.0;  // a MoE layer is capturable with padded token dropping only
  const TimeEstimate eager = time(m, p);
  EXPECT_GT(eager.breakdown.launch_overhead, 0);
  p.cuda_graphs = {GraphImpl::TransformerEngine, kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess};
  const TimeEstimate attn = time(m, p);
  EXPECT_LT(attn.breakdown.launch_overhead, eager.breakdown.launch_overhead);
  p.cuda_graphs = {GraphImpl::FullIteration, 0};
  const TimeEstimate full = time(m, p);
  EXPECT_EQ(full.breakdown.launch_overhead, 0);
  EXPECT_LT(full.step_seconds, eager.step_seconds);
  // The eager step's fixed host time goes with the graph; module graphs leave it; the optimizer step stays.
  EXPECT_GT(eager.breakdown.step_overhead, 0);
  EXPECT_EQ(attn.breakdown.step_overhead, eager.breakdown.step_overhead);
  EXPECT_EQ(full.breakdown.step_overhead, 0);
  EXPECT_DOUBLE_EQ(full.breakdown.optimizer, eager.breakdown.optimizer);
  // Static input buffers stay resident: one hidden-sized input per captured module and layer.
  const double eager_ws = memory(m, zoo_plan("qwen3-30b-a3b", 8, 4096)).stages[0].breakdown.workspace;
  EXPECT_GT(memory(m, p).stages[0].breakdown.workspace, eager_ws);
}

TEST(RunSettings, GraphStaticBuffersByLayerAndCapture) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.cuda_graphs = {GraphImpl::TransformerEngine, kGraphAttn};
  const Calibration cal = bare_calibration();
  const double base = at(estimate_memory(m, toy_plan(), toy_hardware(), cal), 0).workspace;
  // pp 1 without EP overlap: one microbatch captured; attn is one module of each of the two layers, 128 x 64 bf16.
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace - base, 2 * 128 * 64 * 2.0);
  p.cuda_graphs.modules = kGraphAttn | kGraphMlp;
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace - base, 2 * 2 * 128 * 64 * 2.0);
}

// Selective recompute modules (transformer_config.py recompute_modules) drop exactly their tensors: the toy's dense
// layer keeps 16,384 (input) + 67,584 (attention with its norm) + 16,384 (the residual after it, the pre-FFN norm's
// input) + 114,688 (FFN with its norm) = 215,040 bytes.
TEST(RunSettings, RecomputeModulesDropTheirTensors) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.recompute = Recompute::Selective;
  const LayerSpec dense = m.layers[0], moe = m.layers[1];
  auto saved = [&](uint16_t mods, const LayerSpec& l) {
    p.recompute_modules = mods;
    return layer_activation(m, p, l, false).saved;
  };
  const double full = layer_activation(m, p, dense, false).full;
  EXPECT_DOUBLE_EQ(full, 215040);
  EXPECT_DOUBLE_EQ(saved(kRecomputeCoreAttn, dense), full - 2048);             // the log-sum-exp
  EXPECT_DOUBLE_EQ(saved(kRecomputeMlp, dense), full - 65536 - 32768 - 16384);  // fc1, activation, fused norm outputs
  {
    // Under fp8 GEMMs o_proj keeps an fp8 copy of the attention output and flash attention its own bf16 one (2 x 128 x
    // 64), which core_attn drops with the log-sum-exp.
    Plan f = p;
    f.precision = Precision::FP8;
    f.fp8.recipe = Fp8Recipe::Tensorwise;
    f.recompute_modules = 0;
    const double kept = layer_activation(m, f, dense, false).saved;
    f.recompute_modules = kRecomputeCoreAttn;
    EXPECT_DOUBLE_EQ(kept - layer_activation(m, f, dense, false).saved, 2048 + 16384);
    // The MoE layer's router keeps the FFN norm's output in bf16 (2 x 128 x 64), which layernorm drops.
    f.recompute_modules = 0;
    const double kept_moe = layer_activation(m, f, moe, false).saved;
    f.recompute_modules = kRecomputeLayernorm;
    EXPECT_DOUBLE_EQ(kept_moe - layer_activation(m, f, moe, false).saved, 16384);
  }
  // Megatron-LM (Transformer Engine): the attention's norm is fused into QKV and the dense MLP's into fc1, which
  // layernorm leaves alone, and moe_act rebuilds the routed experts' activation only; on the MoE layer layernorm drops
  // its FFN norm's output (a module of its own: the router and the experts read it) and moe_act the experts' activation.
  const double moe_full = layer_activation(m, p, moe, false).full;
  EXPECT_DOUBLE_EQ(saved(kRecomputeLayernorm, dense), full);
  EXPECT_DOUBLE_EQ(saved(kRecomputeMoeAct, dense), full);
  EXPECT_DOUBLE_EQ(saved(kRecomputeLayernorm, moe), moe_full - 16384);
  EXPECT_DOUBLE_EQ(saved(kRecomputeMoeAct, moe), moe_full - 16384);
  // The MoE layer: router 4,096, dispatched 32,768, fc1 32,768, activation 16,384 (Megatron-LM keeps no expert
  // output: the routing weights are applied in the activation).
  EXPECT_DOUBLE_EQ(saved(kRecomputeMoe, moe), moe_full - 4096 - 32768 - 32768 - 16384);
  EXPECT_DOUBLE_EQ(saved(kLegacySelectiveModules, dense), full - 2048);
  // A framework whose norms and MLPs are modules of their own (the article's) drops both norm outputs and every
  // MLP's activation.
  p.implementation = "bumblebee";
  EXPECT_DOUBLE_EQ(saved(kRecomputeMlp, dense), full - 65536 - 32768);         // fc1 and activation outputs
  EXPECT_DOUBLE_EQ(saved(kRecomputeLayernorm, dense), full - 2 * 16384);
  EXPECT_DOUBLE_EQ(saved(kRecomputeMoeAct, dense), full - 32768);
  EXPECT_DOUBLE_EQ(saved(kLegacySelectiveModules, dense), full - 2048 - 2 * 16384 - 32768);
  // Full recompute, uniform method: one checkpoint (the layer input, 16,384) per recompute_layers layers.
  p.recompute = Recompute::Full;
  p.recompute_method = RecomputeMethod::Uniform;
  p.recompute_layers = 2;
  EXPECT_DOUBLE_EQ(layer_activation(m, p, dense, true).saved, 16384.0 / 2);
}

// Fine-grained offloading moves each listed module's input to the host (fine_grained_activation_offloading.md).
TEST(RunSettings, OffloadModulesMoveTheirInputs) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const LayerActivation kept = layer_activation(m, p, m.layers[0], false);
  p.offload.modules = kOffloadCoreAttn | kOffloadAttnProj;
  const LayerActivation off = layer_activation(m, p, m.layers[0], false);
  EXPECT_DOUBLE_EQ(off.offloaded, 32768 + 16384);  // q, k, v and the attention output
  EXPECT_DOUBLE_EQ(off.saved, kept.saved - off.offloaded);
  EXPECT_DOUBLE_EQ(off.full, kept.full);
  p.offload.modules = kOffloadAttnNorm | kOffloadMlpNorm;  // the two norms' inputs: the layer input, the residual after
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).offloaded, 2 * 16384);  // the mixer (not their outputs)
  p.offload.modules_fraction = 0.25;  // --activation-offload-fraction: that share moves, the rest stays saved
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).offloaded, 0.25 * 2 * 16384);
  EXPECT_DOUBLE_EQ(layer_activation(m, p, m.layers[0], false).saved, kept.saved - 0.25 * 2 * 16384);
  p.offload.modules_fraction = 1.5;
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("modules_fraction"), std::string::npos);
  p.offload.modules_fraction = 1;
  p.offload.modules = kOffloadAttnProj;  // needs core_attn
  EXPECT_EQ(check_plan(m, p)->rule, Rule::RunSettings);
}

// --moe-router-dtype: the router's logits and probabilities in fp32 (4,096 bytes on the toy) or the model's bf16.
TEST(RunSettings, RouterDtypeSizesTheRouterTensors) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  const double fp32 = layer_activation(m, p, m.layers[1], false).full;
  p.moe.router_dtype = Dtype::BF16;
  EXPECT_DOUBLE_EQ(fp32 - layer_activation(m, p, m.layers[1], false).full, 2048);
}

// --moe-pad-expert-input-to-capacity: padded experts hold the capacity; unpadded ones what routing sends, up to it.
TEST(RunSettings, CapacityWithAndWithoutPadding) {
  Plan p = toy_plan();
  p.moe.routing_imbalance = 1.2;
  p.moe.capacity_factor = 1.5;
  EXPECT_DOUBLE_EQ(routed_load_factor(p), 1.5);
  p.moe.pad_to_capacity = false;
  EXPECT_DOUBLE_EQ(routed_load_factor(p), 1.2);
  p.moe.routing_imbalance = 2;
  EXPECT_DOUBLE_EQ(routed_load_factor(p), 1.5);
  // HybridEP's per-rank budget drops what a rank receives beyond it (megatron-settings.md, dropless otherwise).
  Plan h = toy_plan();
  h.moe.dispatcher = MoeDispatcher::HybridEP;
  h.moe.routing_imbalance = 2;
  h.moe.rank_capacity_factor = 1.5;
  EXPECT_DOUBLE_EQ(routed_load_factor(h), 1.5);
  h.moe.routing_imbalance = 1.2;
  EXPECT_DOUBLE_EQ(routed_load_factor(h), 1.2);
}

// HybridEP's per-rank budget with the paged stash gives a dropless layer static buffers (megatron-settings.md section
// 4, "MoE"): full_iteration graphs capture it, the launch term and the host count sync go; without the stash the
// layer is refused, and a budget needs HybridEP.
TEST_F(Zoo, HybridEpBudgetAndPagedStashMakeTheLayerCapturable) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 8, 4096);
  p.parallel.ep = 8;
  p.moe.dispatcher = MoeDispatcher::HybridEP;
  p.moe.rank_capacity_factor = 1.5;
  const TimeEstimate eager = time(m, p);
  EXPECT_GT(eager.breakdown.launch_overhead, 0);
  p.cuda_graphs = {GraphImpl::FullIteration, 0};
  ASSERT_TRUE(check_plan(m, p));
  EXPECT_NE(check_plan(m, p)->message.find("paged_stash"), std::string::npos) << check_plan(m, p)->message;
  p.moe.paged_stash = true;
  ASSERT_FALSE(check_plan(m, p)) << check_plan(m, p)->message;
  const TimeEstimate full = time(m, p);
  EXPECT_EQ(full.breakdown.launch_overhead, 0);
  EXPECT_LT(full.step_seconds, eager.step_seconds);
  // Eager, the budgeted layer's static shapes skip the host count sync that dropless routing needs.
  Plan stash = p, dropless = p;
  stash.cuda_graphs = {};
  dropless.cuda_graphs = {}, dropless.moe.paged_stash = false, dropless.moe.rank_capacity_factor = 0;
  EXPECT_LT(time(m, stash).breakdown.compute_moe, time(m, dropless).breakdown.compute_moe);
  Plan a2a = dropless;
  a2a.moe.dispatcher = MoeDispatcher::AllToAll, a2a.moe.rank_capacity_factor = 1.5;
  ASSERT_TRUE(check_plan(m, a2a));
  EXPECT_NE(check_plan(m, a2a)->message.find("hybridep"), std::string::npos) << check_plan(m, a2a)->message;
}

// Megatron-LM MoE README "FP8 Training": fp8 parameters keep no bf16 copy and are all-gathered in fp8, half of bf16.
TEST(RunSettings, Fp8ParamGatherKeepsWeightsInFp8) {
  Calibration cal = bare_calibration();
  cal.low_precision_weight_bytes = 1;
  Plan p = toy_plan();
  p.precision = Precision::FP8;
  EXPECT_DOUBLE_EQ(param_bytes_per_param(p, cal), 3);
  EXPECT_DOUBLE_EQ(param_gather_bytes_per_param(p), 2);
  p.fp8.param_gather = true;
  EXPECT_DOUBLE_EQ(param_bytes_per_param(p, cal), 2);
  EXPECT_DOUBLE_EQ(param_gather_bytes_per_param(p), 1);
  p.precision = Precision::MXFP8;  // gathered in bf16
  EXPECT_DOUBLE_EQ(param_gather_bytes_per_param(p), 2);
  p.precision = Precision::FP8;
  p.optimizer_sharding = OptimizerSharding::None;  // Megatron needs sharded parameters for it
  EXPECT_DOUBLE_EQ(param_bytes_per_param(p, cal), 3);
}

// Dispatchers: DeepEP / HybridEP hold their NVLink and RDMA buffers (fused_a2a.py); the allgather dispatcher gathers
// the EP group's tokens.
TEST(RunSettings, DispatcherBuffers) {
  const ModelSpec m = toy_model();
  Calibration cal = bare_calibration();
  cal.dispatcher_buffer_bytes = 1e9;
  Plan p = toy_plan();
  p.parallel.ep = 2;
  const MemoryEstimate a2a = estimate_memory(m, p, toy_hardware(), cal);
  p.moe.dispatcher = MoeDispatcher::DeepEP;
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace - at(a2a, 0).workspace, 1e9);
  p.moe.dispatcher = MoeDispatcher::HybridEP;
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace - at(a2a, 0).workspace, 1e9);
  p.moe.dispatcher = MoeDispatcher::AllGather;
  const MemoryEstimate ag = estimate_memory(m, p, toy_hardware(), cal);
  EXPECT_DOUBLE_EQ(ag.stages[0].terms.moe_buffers - a2a.stages[0].terms.moe_buffers, 2 * 2 * 128 * 2 * 64.0);
}

// TE userbuffers of [seq x mbs / cp, hidden] (Megatron-LM initialize.py) under --tp-comm-overlap.
TEST(RunSettings, TpOverlapBuffers) {
  const ModelSpec m = toy_model();
  Calibration cal = bare_calibration();
  cal.tp_overlap_buffers = 8;
  Plan p = toy_plan();
  p.parallel.tp = 2;
  const double base = at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace;
  p.comm.tp_overlap = true;
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace - base, 8 * 128 * 64 * 2.0);
  p.implementation = "bumblebee";  // a framework without userbuffers
  EXPECT_DOUBLE_EQ(at(estimate_memory(m, p, toy_hardware(), cal), 0).workspace, base);
}

// The time effects of the switches, each in the direction its source gives.
TEST_F(Zoo, SwitchesMoveTimeAsTheirSourcesSay) {
  const ModelSpec llama = load_model("llama-3.1-70b", data_dir());
  Plan p = zoo_plan("llama-3.1-70b", 64, 8192);
  p.parallel = {4, 2, 1, 2, 1, 1};
  p.global_batch = 64;
  // bf16 gradients halve the DP reduce-scatter bytes; without overlap it is exposed.
  p.comm.overlap_grad_reduce = p.comm.overlap_param_gather = false;
  const double fp32 = time(llama, p).breakdown.exposed_comm.dp_fsdp;
  p.optimizer.grad = Dtype::BF16;
  const double bf16 = time(llama, p).breakdown.exposed_comm.dp_fsdp;
  EXPECT_LT(bf16, fp32);
  // The overlap switches hide it (Megatron --overlap-grad-reduce / --overlap-param-gather).
  p.comm.overlap_grad_reduce = p.comm.overlap_param_gather = true;
  EXPECT_LT(time(llama, p).breakdown.exposed_comm.dp_fsdp, bf16);
  // TE userbuffers hide TP collectives under the GEMMs.
  const double tp_plain = time(llama, p).breakdown.exposed_comm.tp;
  p.comm.tp_overlap = true;
  EXPECT_LT(time(llama, p).breakdown.exposed_comm.tp, tp_plain);
  // CP: all-gather is not overlapped, p2p is hidden under attention; a2a (Ulysses) exposes its all-to-alls.
  const double p2p = time(llama, p).breakdown.exposed_comm.cp;
  p.comm.cp = CpComm::AllGather;
  EXPECT_GT(time(llama, p).breakdown.exposed_comm.cp, p2p);
  p.comm.cp = CpComm::A2A;
  EXPECT_GT(time(llama, p).breakdown.exposed_comm.cp, 0);
  // fp8 attention at FlashAttention-3's fp8 rate (arXiv 2407.08608): less compute.
  p.comm.cp = CpComm::P2P;
  p.precision = Precision::FP8;
  const double bf16_attention = time(llama, p).breakdown.compute;
  p.fp8.attention = true;
  EXPECT_LT(time(llama, p).breakdown.compute, bf16_attention);
}

TEST_F(Zoo, MoeSettingsMoveTime) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 16, 4096);
  p.parallel.ep = 16;
  const double fused = time(m, p).step_seconds;
  p.moe.permute_fusion = false;  // more routed-copy-sized passes (moe_utils.py permute / unpermute)
  EXPECT_GT(time(m, p).step_seconds, fused);
  p.moe.permute_fusion = true;
  p.moe.routing_imbalance = 1.2;  // the busiest rank routes more tokens: slower and larger
  EXPECT_GT(time(m, p).step_seconds, fused);
  Plan balanced = p;
  balanced.moe.routing_imbalance = 1.0;
  EXPECT_GT(memory(m, p).peak_bytes, memory(m, balanced).peak_bytes);
  // The allgather dispatcher moves every rank's tokens to every rank: more than the all-to-all's routed copies at EP 16.
  p.moe.routing_imbalance = 1;
  const double a2a = time(m, p).breakdown.exposed_comm.ep;
  p.moe.dispatcher = MoeDispatcher::AllGather;
  EXPECT_GT(time(m, p).breakdown.exposed_comm.ep, a2a);
}

// Auxiliary-loss routing takes its imbalance from the calibration when the plan gives none.
TEST_F(Zoo, AuxLossRoutingTakesTheCalibratedImbalance) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = zoo_plan("qwen3-30b-a3b", 16, 4096);
  p.assumed = kPlanDefaultFields;
  const std::vector<std::string> said = resolve_run_defaults(p, m, cal(p));
  EXPECT_EQ(p.moe.routing, Routing::AuxLoss);
  EXPECT_DOUBLE_EQ(p.moe.routing_imbalance, cal(p).aux_loss_imbalance);
  EXPECT_EQ(p.assumed, 0u);
  EXPECT_FALSE(said.empty());
  // Megatron-LM's argument defaults for the rest.
  EXPECT_EQ(p.optimizer.grad, Dtype::FP32);
  EXPECT_FALSE(p.comm.overlap_grad_reduce);
  EXPECT_FALSE(p.moe.permute_fusion);
  EXPECT_EQ(p.moe.router_dtype, Dtype::BF16);
  // Megatron-Bridge's perf recipes: bf16 gradient reduction, overlap, forced balance, an fp32 router.
  Plan b = zoo_plan("qwen3-30b-a3b", 16, 4096);
  b.implementation = "megatron-bridge";
  b.assumed = kPlanDefaultFields;
  resolve_run_defaults(b, m, cal(b));
  EXPECT_EQ(b.optimizer.grad, Dtype::BF16);
  EXPECT_TRUE(b.comm.overlap_grad_reduce && b.comm.overlap_param_gather);
  EXPECT_EQ(b.moe.routing, Routing::Forced);
  EXPECT_DOUBLE_EQ(b.moe.routing_imbalance, 1);
  EXPECT_EQ(b.moe.router_dtype, Dtype::FP32);
}
