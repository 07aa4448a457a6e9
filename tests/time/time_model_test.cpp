// Time model behaviour: link tiers, collectives, chunked EP, recompute, bubble, launch floor, FP8.
#include <cstdio>

#include <gtest/gtest.h>

#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "estimator/plan_rules.h"
#include "estimator/run_physics.h"
#include "estimator/time_model.h"
#include "common/data_dir.h"
#include "models/zoo.h"

namespace lcplan {
namespace {

Plan qwen_plan() {
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = 32;
  p.seq_len = 131072;
  p.parallel.ep = 8;
  p.parallel.cp = 4;
  p.recompute = Recompute::Full;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.linear_ce = true;
  return p;
}

// Llama-3.1-8B on 8 GPUs, one sequence per GPU, everything else at its default.
Plan llama_plan(int64_t seq) {
  Plan p;
  p.model = "llama-3.1-8b";
  p.gpus = 8;
  p.seq_len = seq;
  return p;
}

struct Fixture : ::testing::Test {
  ModelSpec m = load_model("qwen3.5-35b-a3b", data_dir());
  Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  Calibration cal = load_calibration("priors", data_dir());
  // The plan's attention time under one calibration over another's.
  double attention_ratio(const ModelSpec& m, const Plan& p, const Calibration& a, const Calibration& b) const {
    const double under_b = estimate_time(m, p, hw, b).breakdown.compute_attention;
    EXPECT_GT(under_b, 0);
    return estimate_time(m, p, hw, a).breakdown.compute_attention / under_b;
  }
};

TEST_F(Fixture, TierFlipsFromNvlinkToNetworkWhenAGroupSpansNodes) {
  // 16 GPUs, 8 per node, Megatron order tp-cp-dp-pp: tp=2 sits in a node; ep=16 spans both nodes, and so do the
  // dp ranks (0, 2, ..., 14). The time model reads these tiers from the plan's derived record.
  Plan p = qwen_plan();
  p.gpus = 16;
  p.parallel = {2, 1, 1, 1, 16, 1};
  p.gpus_per_node = 8;
  DerivedPlan d = derive_plan(m, p, hw);
  EXPECT_EQ(d.tp.tier, LinkTier::NVLink);
  EXPECT_EQ(d.ep.tier, LinkTier::Network);
  EXPECT_EQ(d.ep.nodes, 2);
  EXPECT_EQ(d.dp_cp.tier, LinkTier::Network);
  // One GPU per node: every group crosses the network.
  p.gpus_per_node = 1;
  d = derive_plan(m, p, hw);
  EXPECT_EQ(d.tp.tier, LinkTier::Network);
  EXPECT_EQ(d.ep.nodes, 16);
  // EP 8 over ranks 0..7 of 8-GPU nodes stays on NVLink.
  p.gpus_per_node = 0;  // the hardware profile's 8
  p.parallel = {2, 1, 1, 1, 8, 1};
  EXPECT_EQ(derive_plan(m, p, hw).ep.tier, LinkTier::NVLink);
}

TEST_F(Fixture, NetworkCollectivesAreSlowerAndTpCommGrowsAcrossNodes) {
  const double b = 256e6;
  EXPECT_GT(collective_seconds(Collective::AllGather, b, 8, LinkTier::Network, 2, hw, cal),
            collective_seconds(Collective::AllGather, b, 8, LinkTier::NVLink, 1, hw, cal));
  EXPECT_NEAR(collective_seconds(Collective::AllReduce, b, 8, LinkTier::NVLink, 1, hw, cal) - cal.nvlink_latency,
              2 * (collective_seconds(Collective::ReduceScatter, b, 8, LinkTier::NVLink, 1, hw, cal) - cal.nvlink_latency), 1e-12);
  Plan p = qwen_plan();
  p.parallel.tp = 4;
  p.parallel.cp = 1;
  p.gpus_per_node = 8;
  const double in_node = estimate_time(m, p, hw, cal).breakdown.exposed_comm.tp;
  p.gpus_per_node = 2;  // tp=4 now spans two nodes
  const double across = estimate_time(m, p, hw, cal).breakdown.exposed_comm.tp;
  EXPECT_GT(in_node, 0);
  EXPECT_GT(across, 2 * in_node);
}

TEST_F(Fixture, OutputsAreConsistent) {
  const Plan p = qwen_plan();
  const TimeEstimate t = estimate_time(m, p, hw, cal);
  const TimeBreakdown& b = t.breakdown;
  EXPECT_NEAR(t.step_seconds, b.compute + b.recompute + b.exposed_comm.total() + b.bubble + b.launch_overhead + b.optimizer +
                                  b.offload + b.step_overhead,
              1e-9 * t.step_seconds);
  EXPECT_NEAR(t.tflops_per_gpu, t.model_flops_per_step / t.step_seconds / p.gpus / 1e12, 1e-9);
  EXPECT_NEAR(t.mfu, t.tflops_per_gpu * 1e12 / hw.peak_bf16_flops, 1e-12);
  EXPECT_NEAR(t.tokens_per_second_per_gpu, effective_global_batch(p) * 131072.0 / t.step_seconds / 32, 1e-6);
  EXPECT_GT(t.mfu, 0.05);
  EXPECT_LT(t.mfu, 0.8);
  EXPECT_FALSE(t.bottleneck.empty());
}

// The breakdown says what dominates: on the long-context Qwen3-235B layout (TP4 PP8 VPP4 EP8, CP growing with the
// sequence as in data/validation/megatron-moe-long-context-h100-runs.json), the MoE layers lead at 16K and the
// attention cores at 128K, where causal attention is over 80% of the model FLOPs; both are parts of compute. The CP
// exchange is split into what runs under attention and what is exposed.
TEST_F(Fixture, ComputeSharesFollowTheSequence) {
  const ModelSpec q = load_model("qwen3-235b-a22b", data_dir());
  double prev_attention = 0;
  for (const auto& [seq, cp] : {std::pair{16384, 1}, std::pair{32768, 2}, std::pair{65536, 4}, std::pair{131072, 8}}) {
    Plan p;
    p.model = "qwen3-235b-a22b";
    p.gpus = 256;
    p.seq_len = seq;
    p.global_batch = 256;
    p.parallel = {4, 8, 4, cp, 8, 1};
    p.optimizer_sharding = OptimizerSharding::DistOpt;
    p.recompute = Recompute::Selective;
    require_valid_plan(q, p);
    const TimeBreakdown b = estimate_time(q, p, hw, cal).breakdown;
    const double attention = b.compute_attention / b.compute, moe = b.compute_moe / b.compute;
    std::printf("seq %6d cp %d: attention cores %.0f%%, MoE layers %.0f%% of compute\n", seq, cp, 100 * attention, 100 * moe);
    EXPECT_GT(b.compute_attention, 0);
    EXPECT_GT(b.compute_moe, 0);
    EXPECT_LE(b.compute_attention + b.compute_moe, b.compute);
    EXPECT_GT(attention, prev_attention) << seq;
    // The ring's K/V exchange runs under the attention kernels; gathered first (all_gather), all of it is exposed.
    if (cp == 1) {
      EXPECT_EQ(b.hidden_cp + b.exposed_comm.cp, 0);
    } else {
      EXPECT_GT(b.hidden_cp, 0) << seq;
      p.comm.cp = CpComm::AllGather;
      const TimeBreakdown g = estimate_time(q, p, hw, cal).breakdown;
      EXPECT_EQ(g.hidden_cp, 0);
      EXPECT_NEAR(g.exposed_comm.cp, b.exposed_comm.cp + b.hidden_cp, 1e-9 * g.exposed_comm.cp) << seq;
    }
    if (seq == 16384) {
      EXPECT_GT(moe, attention);
    }
    if (seq == 131072) {
      EXPECT_GT(attention, 2 * moe);
    }
    prev_attention = attention;
  }
  // A dense model has no MoE part.
  const ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  Plan p;
  p.model = "llama-3.1-8b";
  p.gpus = 8;
  p.seq_len = 8192;
  EXPECT_EQ(estimate_time(llama, p, hw, cal).breakdown.compute_moe, 0);
}

TEST_F(Fixture, WideHeadsSlowOnlyTheAttentionBackward) {
  // Flash attention's backward (2.5x the forward's FLOPs) runs at calibration.attention_wide_head_backward of its rate
  // at head dim 256, linearly from 128; the forward and dims up to 128 are untouched.
  ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  const Plan p = llama_plan(32768);
  Calibration slow = cal, plain = cal;
  slow.attention_wide_head_backward = 0.5;
  plain.attention_wide_head_backward = 1.0;
  for (const auto& [dim, bwd_rate] : {std::pair{64, 1.0}, std::pair{128, 1.0}, std::pair{192, 0.75}, std::pair{256, 0.5}}) {
    llama.attn.head_dim = dim;
    EXPECT_NEAR(attention_ratio(llama, p, slow, plain), (1 + 2.5 / bwd_rate) / 3.5, 1e-9) << dim;
  }
}

TEST_F(Fixture, ARingOfCpRanksRunsMostAttentionUnmasked) {
  // TransformerEngine's load-balanced K/V ring runs a rank's own chunks under the causal mask and the cp - 1 received
  // ones without it, 1/cp of the FLOPs each; unmasked kernels run 1 / attention_causal_ratio faster. a2a (Ulysses) and
  // all_gather run causal kernels over what they gather; a2a+p2p rings over cp / cp_a2a_size.
  const ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  Plan p = llama_plan(131072);
  p.parallel.cp = 8;
  Calibration masked = cal, plain = cal;
  masked.attention_causal_ratio = 0.8;
  plain.attention_causal_ratio = 1.0;
  const std::pair<CpComm, double> cases[] = {
      {CpComm::P2P, 1.0 / 8}, {CpComm::AllGather, 1.0}, {CpComm::A2A, 1.0}, {CpComm::A2AP2P, 2.0 / 8}};
  for (const auto& [type, causal] : cases) {
    p.comm.cp = type;
    p.comm.cp_a2a_size = type == CpComm::A2AP2P ? 2 : 1;
    EXPECT_DOUBLE_EQ(derive_plan(llama, p, hw).causal_share, causal) << to_string(type);
    EXPECT_NEAR(attention_ratio(llama, p, masked, plain), causal + (1 - causal) * 0.8, 1e-9) << to_string(type);
  }
  // Hybrid CP: each sequence by the ranks it is split over, weighted by the attention work it leaves on a rank.
  p.packed_lengths = {65536, 16384};
  p.packed_splits = {8, 2};
  p.comm.cp = CpComm::P2P;
  const double big = 65536.0 * 65536 / 8, small = 16384.0 * 16384 / 2;
  EXPECT_NEAR(derive_plan(llama, p, hw).causal_share, (big / 8 + small / 2) / (big + small), 1e-12);
  p.comm.cp = CpComm::AllGather;
  EXPECT_DOUBLE_EQ(derive_plan(llama, p, hw).causal_share, 1.0);
  p.packed_lengths.clear(), p.packed_splits.clear();
  p.parallel.cp = 1;  // one rank: every kernel causal, the ratio moves nothing
  EXPECT_DOUBLE_EQ(derive_plan(llama, p, hw).causal_share, 1.0);
  EXPECT_DOUBLE_EQ(attention_ratio(llama, p, masked, plain), 1.0);
}

// Hybrid CP (Plan::packed_splits): a sequence split over g of the cp ranks exchanges its K/V in a ring of those g
// ranks, as a regular CP group of g does, not around all cp (Megatron-LM's hybrid CP sub-groups); a whole sequence
// exchanges nothing.
TEST_F(Fixture, AHybridCpSequenceRingsOverItsOwnRanks) {
  const ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  auto cp_comm = [&](const Plan& p) {
    EXPECT_EQ(check_plan(llama, p), std::nullopt);
    const TimeBreakdown b = estimate_time(llama, p, hw, cal).breakdown;
    return b.exposed_comm.cp + b.hidden_cp;
  };
  // One 32K sequence over 2 ranks: as hybrid CP's busiest rank of a cp 8 group it appears cp / g = 4 times.
  Plan regular = llama_plan(32768);
  regular.gpus = 2, regular.parallel.cp = 2, regular.global_batch = 1;
  Plan hybrid = llama_plan(4 * 32768);
  hybrid.gpus = 8, hybrid.parallel.cp = 8, hybrid.global_batch = 1;
  hybrid.packed_lengths = {32768, 32768, 32768, 32768};
  hybrid.packed_splits = {2, 2, 2, 2};
  const double ring_of_two = cp_comm(regular);
  ASSERT_GT(ring_of_two, 0);
  EXPECT_NEAR(cp_comm(hybrid) / ring_of_two, 1.0, 1e-9);
  hybrid.packed_splits = {1, 1, 1, 1};
  hybrid.packed_lengths = {32768, 32768, 32768, 32768};
  EXPECT_DOUBLE_EQ(cp_comm(hybrid), 0.0);
}

TEST_F(Fixture, ASlidingWindowRunsAtItsWindowsRate) {
  // Flash attention's rate rises with the keys a query tile walks (attention_half_seq); a window of w keys walks as
  // many as a causal sequence of 2w, so a sliding layer runs at that length's rate, a full one at its sequence's.
  ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  const Plan p = llama_plan(32768);
  Calibration curved = cal, flat = cal;
  curved.attention_half_seq = 238;
  flat.attention_half_seq = 0;
  EXPECT_NEAR(attention_ratio(llama, p, curved, flat), (32768 + 238) / 32768.0, 1e-9);
  for (LayerSpec& l : llama.layers) l.sliding = true;
  llama.attn.sliding_window = 1024;
  EXPECT_NEAR(attention_ratio(llama, p, curved, flat), (2048 + 238) / 2048.0, 1e-9);
}

TEST_F(Fixture, FullRecomputeAddsAForwardButNotModelFlops) {
  Plan p = qwen_plan();
  // Qwen3.5's head dim 256 backward at its head-dim-128 rate, so that every backward costs 2-2.5 forwards.
  Calibration cal = this->cal;
  cal.attention_wide_head_backward = 1.0;
  const TimeEstimate full = estimate_time(m, p, hw, cal);
  p.recompute = Recompute::None;
  const TimeEstimate none = estimate_time(m, p, hw, cal);
  EXPECT_DOUBLE_EQ(full.model_flops_per_step, none.model_flops_per_step);
  EXPECT_EQ(none.breakdown.recompute, 0);
  // Recompute replays the forward: about half the backward's compute, i.e. ~1/3 of fwd+bwd.
  EXPECT_NEAR(full.breakdown.recompute / full.breakdown.compute, 1.0 / 3, 0.08);
  EXPECT_LT(full.tflops_per_gpu, none.tflops_per_gpu);
}

TEST_F(Fixture, BubbleShrinksWithVppAndMicrobatches) {
  Plan p = qwen_plan();
  p.parallel.pp = 4;
  p.parallel.cp = 1;
  p.seq_len = 32768;
  p.global_batch = 8 * 4;  // dp 8, 4 microbatches
  const TimeEstimate a = estimate_time(m, p, hw, cal);
  p.parallel.vpp = 2;
  const TimeEstimate b = estimate_time(m, p, hw, cal);
  EXPECT_NEAR(b.breakdown.bubble / a.breakdown.bubble, 0.5, 0.1);
  p.parallel.vpp = 1;
  p.global_batch = 8 * 16;
  const TimeEstimate c = estimate_time(m, p, hw, cal);
  // Bubble is (pp-1)/(m*vpp) of the m microbatches' time: the same absolute time, a smaller share of the step.
  EXPECT_NEAR(c.breakdown.bubble, a.breakdown.bubble, 1e-9 * a.breakdown.bubble);
  EXPECT_LT(c.breakdown.bubble / c.step_seconds, 0.5 * a.breakdown.bubble / a.step_seconds);
}

TEST_F(Fixture, ChunkedEpHidesAllToAll) {
  // With the shipped profile for the article's framework: chunking pays at 128K (article section 2.4).
  cal = calibration_for(load_calibration("default", data_dir()), hw.name, "bumblebee");
  Plan p = qwen_plan();
  const TimeEstimate one = estimate_time(m, p, hw, cal);
  p.moe.ep_chunks = 2;
  const TimeEstimate two = estimate_time(m, p, hw, cal);
  EXPECT_LT(two.breakdown.exposed_comm.ep, one.breakdown.exposed_comm.ep);
  EXPECT_GT(two.tflops_per_gpu, one.tflops_per_gpu);
}

// Inside one node the alltoall dispatcher sends every routed copy and sorts what it receives by local expert; DeepEP
// and HybridEP send a token once per destination rank and do not sort. With one expert per rank (Mixtral at EP 8) a
// token's two experts are on two ranks and nothing is sorted: the three cost the same; with 32 experts per rank
// (Qwen3.5 at EP 8) the flex dispatchers move fewer bytes and passes.
// Latent MoE exchanges and buffers latent-width tokens: the MoE layer's all-to-all bytes and routed-copy buffers go
// with the latent width, and at half the hidden width its experts' GEMMs halve; the projections add two dense GEMMs.
TEST_F(Fixture, LatentMoeMovesLatentWidthTokens) {
  ModelSpec mix = load_model("mixtral-8x7b", data_dir());
  Plan p;
  p.model = mix.name;
  p.gpus = 8;
  p.seq_len = 8192;
  p.parallel.ep = 8;
  auto run = [&](const ModelSpec& model) { return estimate_time(model, p, hw, cal).breakdown; };
  ModelSpec lat = mix;
  lat.moe.latent = mix.hidden / 2;
  const TimeBreakdown a = run(mix), b = run(lat);
  // Half the bytes through the same calls, whose fixed latency does not shrink: over half, well under the whole.
  EXPECT_GT(b.exposed_comm.ep, 0.5 * a.exposed_comm.ep);
  EXPECT_LT(b.exposed_comm.ep, 0.62 * a.exposed_comm.ep);
  EXPECT_LT(b.compute_moe, 0.6 * a.compute_moe);
  const double full = estimate_memory(derive_plan(mix, p, hw), cal).stages[0].terms.moe_buffers;
  ASSERT_GT(full, 0);
  EXPECT_NEAR(estimate_memory(derive_plan(lat, p, hw), cal).stages[0].terms.moe_buffers, full / 2, 1e-6 * full);
}

TEST_F(Fixture, DispatchersMoveWhatTheySend) {
  auto layer = [&](const std::string& model, MoeDispatcher disp) {
    Plan p;
    p.model = model;
    p.gpus = 8;
    p.seq_len = 8192;
    p.parallel.ep = 8;
    p.moe.dispatcher = disp;
    const MoeLayerTime t = moe_layer_time(derive_plan(load_model(model, data_dir()), p, hw), hw, cal);
    return t.forward + t.backward;
  };
  EXPECT_NEAR(layer("mixtral-8x7b", MoeDispatcher::DeepEP), layer("mixtral-8x7b", MoeDispatcher::AllToAll), 1e-12);
  EXPECT_NEAR(layer("mixtral-8x7b", MoeDispatcher::HybridEP), layer("mixtral-8x7b", MoeDispatcher::AllToAll), 1e-12);
  EXPECT_LT(layer("qwen3.5-35b-a3b", MoeDispatcher::DeepEP), 0.97 * layer("qwen3.5-35b-a3b", MoeDispatcher::AllToAll));
}

TEST_F(Fixture, GroupLimitedRoutingReachesFewerNodes) {
  // DeepSeek-V3 routes each token to its top 4 of 8 expert groups, then its top 8 experts inside them: over 8 nodes
  // (a group each) at most 4 nodes, 4 (1 - C(96, 8) / C(128, 8)) on average, against 8 (1 - C(224, 8) / C(256, 8))
  // without the limit; over 64 ranks (8 per group), 32 ranks of 4 experts each hold the 128 candidates.
  const ModelSpec ds = load_model("deepseek-v3", data_dir());
  ASSERT_EQ(ds.moe.router, RouterKind::SigmoidGroupLimited);
  auto none = [](double e, double bins, double k) {  // chance a bin holds none of k experts drawn from e
    double q = 1;
    for (int i = 0; i < int(k); ++i) q *= (e - e / bins - i) / (e - i);
    return bins * (1 - q);
  };
  EXPECT_NEAR(bins_reached(ds.moe, 8), none(128, 4, 8), 1e-12);
  EXPECT_NEAR(bins_reached(ds.moe, 64), none(128, 32, 8), 1e-12);
  EXPECT_NEAR(bins_reached(ds.moe, 4), none(128, none(8, 4, 4), 8), 1e-12);  // two groups per node
  EXPECT_LT(bins_reached(ds.moe, 8), 4.0);
  EXPECT_NEAR(distinct_groups(256, 8, 8), none(256, 8, 8), 1e-12);
  MoeSpec plain = ds.moe;
  plain.router = RouterKind::SoftmaxTopK;
  EXPECT_NEAR(bins_reached(plain, 8), distinct_groups(256, 8, 8), 1e-12);
  // DeepEP sends a token once per node across nodes, so the limit shortens its dispatch; the alltoall dispatcher
  // sends every copy whatever the routing.
  auto layer = [&](const ModelSpec& m, MoeDispatcher disp) {
    Plan p;
    p.model = "deepseek-v3";
    p.gpus = 64;
    p.seq_len = 4096;
    p.parallel.ep = 64;
    p.moe.dispatcher = disp;
    const MoeLayerTime t = moe_layer_time(derive_plan(m, p, hw), hw, cal);
    return t.forward + t.backward;
  };
  ModelSpec unlimited = ds;
  unlimited.moe.router = RouterKind::SoftmaxTopK;
  EXPECT_LT(layer(ds, MoeDispatcher::DeepEP), layer(unlimited, MoeDispatcher::DeepEP));
  EXPECT_DOUBLE_EQ(layer(ds, MoeDispatcher::AllToAll), layer(unlimited, MoeDispatcher::AllToAll));
}

TEST_F(Fixture, TheOptimizerStepScalesWithItsShard) {
  // Adam's bytes and gradient clipping's 12 (norm read, scale read and write of each fp32 main gradient) per
  // parameter of the rank's distributed-optimizer shard, memory-bound, plus two scalar all-reduces over every rank.
  const ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  Plan p = llama_plan(8192);
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  const DerivedPlan d = derive_plan(llama, p, hw);
  const double shard = (d.stages[0].params.dense + d.stages[0].params.expert) / 8;
  const double bytes = (optimizer_step_bytes_per_param(p, cal) + 12) * shard;
  const double expected = bytes / (hw.hbm_bandwidth * cal.hbm_efficiency) + 2 * cal.nvlink_latency;
  EXPECT_NEAR(estimate_time(llama, p, hw, cal).breakdown.optimizer, expected, 1e-12);
  // lcplan-exec does not clip: it reads the gradients once for the norm it reports, summed with the loss in one
  // all-reduce.
  p.implementation = "lcplan-exec";
  const double unclipped = (optimizer_step_bytes_per_param(p, cal) + 4) * shard / (hw.hbm_bandwidth * cal.hbm_efficiency);
  EXPECT_NEAR(estimate_time(llama, p, hw, cal).breakdown.optimizer, unclipped + cal.nvlink_latency, 1e-12);
}

TEST_F(Fixture, ShortLocalSequencesPayTheLaunchFloor) {
  Plan p = qwen_plan();
  p.recompute = Recompute::None;
  p.seq_len = 4096;
  p.parallel.cp = 4;  // 1K tokens per GPU
  const TimeEstimate short_seq = estimate_time(m, p, hw, cal);
  p.seq_len = 131072;
  const TimeEstimate long_seq = estimate_time(m, p, hw, cal);
  EXPECT_GT(short_seq.breakdown.launch_overhead / short_seq.step_seconds, long_seq.breakdown.launch_overhead / long_seq.step_seconds);
  EXPECT_LT(short_seq.mfu, long_seq.mfu);
}

TEST_F(Fixture, Fp8SpeedsUpGemmsOnly) {
  const ModelSpec llama = load_model("llama-3.1-8b", data_dir());
  Plan p;
  p.model = "llama-3.1-8b";
  p.gpus = 8;
  p.seq_len = 8192;
  const TimeEstimate bf16 = estimate_time(llama, p, hw, cal);
  p.precision = Precision::FP8;
  const TimeEstimate fp8 = estimate_time(llama, p, hw, cal);
  EXPECT_LT(fp8.step_seconds, bf16.step_seconds);
  EXPECT_GT(fp8.step_seconds, 0.5 * bf16.step_seconds);  // attention and elementwise stay at bf16 speed
  EXPECT_DOUBLE_EQ(fp8.model_flops_per_step, bf16.model_flops_per_step);
}

TEST_F(Fixture, PhasesSumToTheStep) {
  // The executor's phases split the step without adding or losing time, whatever the layout: each plan below turns on
  // a different set of breakdown terms (recompute, FSDP, CP, EP, PP with its bubble and sends, TP, offload, overlap).
  const Calibration bumblebee = calibration_for(load_calibration("default", data_dir()), hw.name, "bumblebee");
  std::vector<std::pair<Plan, const Calibration*>> plans;
  plans.push_back({qwen_plan(), &cal});
  Plan p = qwen_plan();
  p.parallel = {2, 4, 2, 1, 4, 1};
  p.seq_len = 32768;
  p.global_batch = 16;
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  p.recompute = Recompute::Selective;
  plans.push_back({p, &bumblebee});
  p = qwen_plan();
  p.recompute = Recompute::None;
  p.moe.ep_chunks = 2;
  p.moe.a2a_overlap = true;
  p.offload.activations = true;
  p.offload.optimizer = true;
  p.optimizer_sharding = OptimizerSharding::None;
  plans.push_back({p, &bumblebee});
  for (const auto& [plan, c] : plans) {
    ASSERT_FALSE(check_plan(m, plan).has_value()) << check_plan(m, plan)->message;
    const TimeEstimate t = estimate_time(m, plan, hw, *c);
    const PhaseSeconds& ph = t.phases;
    EXPECT_NEAR(ph.total(), t.step_seconds, 1e-9 * t.step_seconds);
    for (double x : {ph.forward, ph.loss, ph.backward, ph.optimizer}) EXPECT_GT(x, 0);
    // The backward is the larger pass (dgrad + wgrad, and any recompute lands there).
    EXPECT_GT(ph.backward, ph.forward);
    EXPECT_GE(ph.optimizer, t.breakdown.optimizer + t.breakdown.step_overhead);
  }
  // Full recompute's replay is backward time: the forward phase is the same as without it.
  Plan none = qwen_plan();
  none.recompute = Recompute::None;
  const TimeEstimate full = estimate_time(m, qwen_plan(), hw, cal), plain = estimate_time(m, none, hw, cal);
  EXPECT_NEAR(full.phases.forward, plain.phases.forward, 0.02 * plain.phases.forward);
  EXPECT_GT(full.phases.backward - plain.phases.backward, 0.8 * full.breakdown.recompute);
}

}  // namespace
}  // namespace lcplan
