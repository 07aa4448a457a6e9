// The derived record of a plan: what memory and time both read, computed once.
#include <gtest/gtest.h>

#include "estimator/derived_plan.h"
#include "estimator/memory_model.h"
#include "estimator/plan_rules.h"
#include "estimator/time_model.h"
#include "models/params.h"
#include "tests/common/toy_model.h"

namespace lcplan {
namespace {

using testing::bare_calibration;
using testing::toy_hardware;
using testing::toy_model;

Plan toy_plan() {
  Plan p;
  p.model = "toy";
  p.gpus = 4;
  p.seq_len = 128;
  return p;
}

TEST(DerivedPlan, TokensAndGroups) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.parallel = {2, 1, 1, 2, 2, 1};  // tp 2, cp 2, ep 2 -> dp 1, edp 1
  ASSERT_FALSE(check_plan(m, p));
  const DerivedPlan d = derive_plan(m, p, toy_hardware());
  EXPECT_EQ(d.dp, 1);
  EXPECT_EQ(d.edp, 2);  // tp*cp*dp / (ep*etp) = 4 / 2
  EXPECT_DOUBLE_EQ(d.local_tokens, 64);   // 128 / cp
  EXPECT_DOUBLE_EQ(d.hidden_tokens, 32);  // / tp under sequence parallelism
  EXPECT_DOUBLE_EQ(d.routed_tokens, 32 * 2);  // hidden tokens x top_k
  EXPECT_DOUBLE_EQ(d.tokens_per_local_expert, 64.0 * 2 / 4);
  EXPECT_EQ(d.tp.size, 2);
  EXPECT_EQ(d.ep.size, 2);
  EXPECT_EQ(d.tp.tier, LinkTier::NVLink);
  EXPECT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.kinds.size(), 2u);
}

// Every parameter lands on exactly one stage: the stages' units add up to the model's parameters.
TEST(DerivedPlan, StageParametersAddUpToTheModel) {
  const ModelSpec m = toy_model();
  Plan p = toy_plan();
  p.gpus = 2;
  p.parallel.pp = 2;
  ASSERT_FALSE(check_plan(m, p));
  const DerivedPlan d = derive_plan(m, p, toy_hardware());
  ASSERT_EQ(d.stages.size(), 2u);
  const double sum = d.stages[0].params.dense + d.stages[0].params.expert + d.stages[1].params.dense +
                     d.stages[1].params.expert;
  EXPECT_DOUBLE_EQ(sum, count_params(m).total);
  EXPECT_EQ(d.stages[0].layers, 1);
  EXPECT_EQ(d.stages[1].layers, 1);
  EXPECT_DOUBLE_EQ(d.layers[0].inflight, 2);  // 1F1B: stage 0 of 2 holds 2 (the default batch fills the pipeline)
  EXPECT_DOUBLE_EQ(d.layers[1].inflight, 1);
}

// Token dropping pads every expert to its capacity: routed tokens are capacity_factor x the mean whatever the
// imbalance, in memory and in time alike; dropless routing carries the imbalance.
TEST(DerivedPlan, CapacityFactorSetsRoutedTokensForMemoryAndTime) {
  const ModelSpec m = toy_model();
  Hardware hw = toy_hardware();
  hw.peak_bf16_flops = 1e15;
  hw.hbm_bandwidth = 3e12;
  hw.nvlink_bandwidth = 4.5e11;
  hw.network_bandwidth = 5e10;
  Calibration cal = bare_calibration();
  cal.moe_buffer_copies = 4;
  cal.gemm_efficiency = cal.grouped_gemm_efficiency = cal.attention_efficiency = 0.5;
  cal.gemm_half_tokens = cal.grouped_gemm_half_tokens = cal.attention_half_seq = 1;
  cal.hbm_efficiency = cal.linear_attention_efficiency = 0.5;
  cal.linear_ce_slowdown = 1;
  cal.nvlink_efficiency = cal.network_efficiency = cal.a2a_nvlink_efficiency = cal.a2a_network_efficiency = 0.5;
  Plan p = toy_plan();
  p.gpus = 2;
  p.parallel.ep = 2;
  p.moe.routing_imbalance = 1.3;
  p.moe.capacity_factor = 1.5;
  p.linear_ce = true;  // keeps the loss phase below the MoE phases, so the peak breakdown shows the MoE buffers
  ASSERT_FALSE(check_plan(m, p));
  const DerivedPlan dropping = derive_plan(m, p, hw);
  EXPECT_DOUBLE_EQ(dropping.routed_tokens, 128 * 2 * 1.5);
  Plan q = p;
  q.moe.capacity_factor = 0;
  q.moe.routing_imbalance = 1.5;
  const DerivedPlan dropless = derive_plan(m, q, hw);
  EXPECT_DOUBLE_EQ(dropless.routed_tokens, dropping.routed_tokens);
  // Memory: the MoE buffers and the MoE activations are the same bytes.
  const MemoryEstimate a = estimate_memory(dropping, cal), b = estimate_memory(dropless, cal);
  EXPECT_DOUBLE_EQ(a.stages[0].breakdown.moe_buffers, 4 * 2 * dropping.routed_tokens * m.hidden);
  EXPECT_DOUBLE_EQ(a.stages[0].breakdown.moe_buffers, b.stages[0].breakdown.moe_buffers);
  EXPECT_DOUBLE_EQ(a.stages[0].breakdown.activations, b.stages[0].breakdown.activations);
  // Time: the expert GEMMs see the same tokens (the host sync is the only difference, zero here).
  const MoeLayerTime ta = moe_layer_time(dropping, hw, cal), tb = moe_layer_time(dropless, hw, cal);
  EXPECT_NEAR(ta.forward, tb.forward, 1e-15);
  EXPECT_NEAR(ta.backward, tb.backward, 1e-15);
  // And a larger capacity factor costs more of both.
  Plan r = p;
  r.moe.capacity_factor = 2;
  const DerivedPlan more = derive_plan(m, r, hw);
  EXPECT_GT(estimate_memory(more, cal).stages[0].breakdown.moe_buffers, a.stages[0].breakdown.moe_buffers);
  EXPECT_GT(moe_layer_time(more, hw, cal).forward, ta.forward);
}

}  // namespace
}  // namespace lcplan
