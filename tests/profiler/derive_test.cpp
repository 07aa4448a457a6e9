// Coefficients derived from synthetic measurements (profiler/profile_data.h): every efficiency is the estimator's
// inverse, so rows generated from known coefficients give them back; the CPU hardware profile's peaks are the best
// measurements / 0.95; the plan's shapes are the reference recipe's; the CPU budget shrinks shapes as stated.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data_dir.h"
#include "estimator/flops.h"
#include "estimator/hardware.h"
#include "estimator/plan_rules.h"
#include "estimator/time_model.h"
#include "models/zoo.h"
#include "profiler/profile_data.h"
#include "profiler/shapes.h"

namespace lcplan::profiler {
namespace {

Hardware test_hw() {
  Hardware h;
  h.name = "test-gpu";
  h.peak_bf16_flops = 1000e12;
  h.peak_fp8_flops = 2000e12;
  h.hbm_bandwidth = 3e12;
  h.nvlink_bandwidth = 450e9;
  h.network_bandwidth = 50e9;
  h.host_bandwidth = 64e9;
  h.hbm_bytes = 80e9;
  return h;
}

double curve(double max, double half, double x) { return max * x / (x + half); }

TEST(Derive, EveryCoefficientFromRowsMadeWithIt) {
  const Hardware hw = test_hw();
  ProfileData d;
  for (int64_t m : {64, 256, 1024, 4096, 16384}) {
    GemmRow r{m, 4096, 4096, "bf16", "c", 0};
    r.seconds = r.flops() / (hw.peak_bf16_flops * curve(0.7, 250, double(m)));
    d.gemm.push_back(r);
    GemmRow r8 = r;
    r8.type = "fp8";
    r8.seconds = r.flops() / (hw.peak_fp8_flops * 0.9 * curve(0.7, 250, double(m)));
    d.gemm.push_back(r8);
  }
  for (int64_t t : {16, 64, 256, 1024, 4096}) {
    GroupedRow r{8, t, 2048, 768, 0};
    r.seconds = r.flops() / (hw.peak_bf16_flops * curve(0.3, 400, double(t)));
    d.grouped.push_back(r);
  }
  for (int64_t s : {1024, 4096, 16384}) {
    AttentionRow r{s, 16, 2, 64, 4.0 * 16 * 64 * double(s) * double(s) / 2, 0};
    // Head dim 64 runs at FlashAttention-3's 3/4 factor (estimator/time_model.cpp).
    r.seconds = 3.5 * r.forward_flops / (hw.peak_bf16_flops * attention_head_dim_factor(64) * curve(0.4, 500, double(s)));
    d.attention.push_back(r);
  }
  d.linear_attention.push_back({4096, 16, 32, 128, 128, 1e12, 3e12 / (hw.peak_bf16_flops * 0.12)});
  d.linear_ce.push_back({4096, 2048, 65536, 3072, 256, "bf16", 1.3, 1.0});
  d.linear_ce.push_back({4096, 2048, 65536, 1024, 256, "bf16", 2.0, 1.0});
  d.copy.push_back({1e9, 2e9 / (hw.hbm_bandwidth * 0.85)});
  d.copy.push_back({1e6, 2e6 / (hw.hbm_bandwidth * 0.3)});  // cache-sized: not a memory-bound pass
  d.launch.push_back({"k", 4e-6});
  for (double b = 1 << 12; b <= (1 << 28); b *= 4) {
    for (Coll c : {Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce, Coll::SendRecv}) {
      CollectiveRow r{"node", 8, 1, LinkTier::NVLink, c, b, 0};
      r.seconds = 12e-6 + b * bus_factor(c, 8) / (450e9 * 0.8);
      d.collectives.push_back(r);
      CollectiveRow n{"cross-node", 2, 2, LinkTier::Network, c, b, 0};
      n.seconds = 30e-6 + b * bus_factor(c, 2) / (50e9 * 0.7);
      d.collectives.push_back(n);
    }
    CollectiveRow a{"node", 8, 1, LinkTier::NVLink, Coll::AllToAll, b, 0};
    a.seconds = 40e-6 + b * 7.0 / 8 / (450e9 * 0.6);
    d.collectives.push_back(a);
  }
  Calibration start;
  start.linear_ce_vocab_tile = 3072;
  const Derived r = derive_coefficients(d, hw, start);
  auto v = [&](const char* k) {
    const auto it = r.coefficients.find(k);
    return it == r.coefficients.end() ? -1.0 : it->second.value;
  };
  EXPECT_NEAR(v("time.gemm_efficiency"), 0.7, 1e-3);
  EXPECT_NEAR(v("time.gemm_half_tokens"), 250, 1);
  EXPECT_NEAR(v("time.fp8_gemm_ratio"), 0.9, 1e-9);
  EXPECT_NEAR(v("time.grouped_gemm_efficiency"), 0.3, 1e-3);
  EXPECT_NEAR(v("time.grouped_gemm_half_tokens"), 400, 2);
  EXPECT_NEAR(v("time.attention_efficiency"), 0.4, 1e-3);
  EXPECT_NEAR(v("time.attention_half_seq"), 500, 3);
  EXPECT_NEAR(v("time.linear_attention_efficiency"), 0.12, 1e-9);
  EXPECT_NEAR(v("time.linear_ce_slowdown"), 1.3, 1e-9);  // the profile's tile, not every tile
  EXPECT_NEAR(v("time.hbm_efficiency"), 0.85, 1e-9);
  EXPECT_NEAR(v("time.launch_seconds"), 4e-6, 1e-15);
  EXPECT_NEAR(v("time.nvlink_latency"), 12e-6, 1e-9);
  EXPECT_NEAR(v("time.nvlink_efficiency"), 0.8, 1e-6);
  EXPECT_NEAR(v("time.network_latency"), 30e-6, 1e-9);
  EXPECT_NEAR(v("time.network_efficiency"), 0.7, 1e-6);
  EXPECT_NEAR(v("time.a2a_nvlink_efficiency"), 0.6, 1e-6);
  EXPECT_NEAR(v("time.a2a_latency"), 28e-6, 1e-9);  // 40 us all-to-all fixed cost - 12 us ring latency
  EXPECT_EQ(v("time.a2a_network_efficiency"), -1);  // not measured, not written
  for (const auto& [k, m] : r.coefficients) EXPECT_FALSE(m.how.empty()) << k;
}

TEST(Derive, NothingMeasuredNothingDerived) {
  const Derived r = derive_coefficients(ProfileData{}, test_hw(), Calibration{});
  EXPECT_TRUE(r.coefficients.empty());
}

TEST(Derive, WideHeadAttentionIsSplitAsTheEstimatorCostsIt) {
  // Head dim 256: the forward at the calibrated rate, the backward (2.5x its FLOPs) at the start profile's
  // attention_wide_head_backward of it; the derived efficiency is the forward's, as time_model.cpp reads it.
  const Hardware hw = test_hw();
  Calibration start;
  start.attention_wide_head_backward = 0.5;
  ProfileData d;
  for (int64_t s : {1024, 4096, 16384}) {
    AttentionRow r{s, 8, 2, 256, 4.0 * 8 * 256 * double(s) * double(s) / 2, 0};
    const double fwd = r.forward_flops / (hw.peak_bf16_flops * curve(0.45, 300, double(s)));
    r.seconds = fwd * (1 + 2.5 / 0.5);
    d.attention.push_back(r);
  }
  const Derived r = derive_coefficients(d, hw, start);
  EXPECT_NEAR(r.coefficients.at("time.attention_efficiency").value, 0.45, 1e-3);
  EXPECT_NEAR(r.coefficients.at("time.attention_half_seq").value, 300, 2);
  // Read with a backward as fast as the forward's rate, the same rows give a lower efficiency.
  start.attention_wide_head_backward = 1.0;
  EXPECT_LT(derive_coefficients(d, hw, start).coefficients.at("time.attention_efficiency").value, 0.3);
}

TEST(CpuHardware, PeaksAreTheBestMeasurementsOver095) {
  ProfileData d;
  d.gemm.push_back({1024, 1024, 1024, "fp32", "c", 2.0 * 1024 * 1024 * 1024 / 50e9});  // 50 GFLOP/s
  d.gemm.push_back({64, 1024, 1024, "fp32", "c", 2.0 * 64 * 1024 * 1024 / 30e9});
  d.copy.push_back({64e6, 2 * 64e6 / 20e9});
  d.collectives.push_back({"node", 2, 1, LinkTier::NVLink, Coll::SendRecv, 1e6, 1e6 / 8e9});
  d.collectives.push_back({"node", 2, 1, LinkTier::NVLink, Coll::AllGather, 1e6, 1e6 * 0.5 / 6e9});
  const nlohmann::json j = cpu_hardware_json(d, {"cpu-test-2c", "Test CPU", "2026-01-01", "lcplan profile", 16e9, 2});
  const Hardware h = hardware_from_json(j, "cpu-test-2c");
  EXPECT_NEAR(h.peak_bf16_flops, 50e9 / 0.95, 1);
  EXPECT_EQ(h.peak_fp8_flops, h.peak_bf16_flops);
  EXPECT_NEAR(h.hbm_bandwidth, 20e9 / 0.95, 1);
  EXPECT_NEAR(h.nvlink_bandwidth, 8e9 / 0.95, 1);
  EXPECT_NEAR(h.host_bandwidth, 8e9 / 0.95, 1);
  EXPECT_EQ(h.network_bandwidth, h.nvlink_bandwidth);  // one node: no network measured
  EXPECT_EQ(h.gpus_per_node, 2);
  EXPECT_NEAR(h.hbm_bytes, 8e9, 1);
  EXPECT_FALSE(h.block_scaled);
  EXPECT_NE(h.source.find("no bf16 or fp8 tensor cores"), std::string::npos);
  EXPECT_THROW(cpu_hardware_json(ProfileData{}, {"cpu-x", "x", "d", "c", 1e9, 1}), std::invalid_argument);
}

TEST(Shapes, GeometricAndBudget) {
  EXPECT_EQ(geometric(64, 1000, 4), (std::vector<int64_t>{64, 256, 1000}));
  EXPECT_EQ(geometric(16, 16, 2), (std::vector<int64_t>{16}));
  int64_t n = 8192, k = 2048;
  const std::string note = shrink_to_budget({{"n", &n, 128, 0}, {"k", &k, 128, 0}},
                                            [&] { return 2.0 * 1024 * double(n) * double(k); }, 2e9);
  EXPECT_LE(2.0 * 1024 * n * k, 2e9);
  EXPECT_EQ(n, 512);  // the larger dimension halves first (8192 -> 2048 before k moves): proportions kept
  EXPECT_EQ(k, 1024);
  EXPECT_EQ(note, "n 8192->512, k 2048->1024");
  int64_t a = 4, b = 4;
  EXPECT_EQ(shrink_to_budget({{"a", &a, 4, 0}, {"b", &b, 2, 1}}, [&] { return double(a * b); }, 1), "b 4->2");
  EXPECT_EQ(shrink_to_budget({{"a", &a, 1, 0}}, [&] { return double(a); }, 0), "");  // no budget: unchanged
}

TEST(Shapes, ReferencePlan) {
  // Qwen3.5-35B-A3B, 32 GPUs, 128K, TP1 PP1 EP8 CP4, FSDP, full recompute, linear CE, 2 chunks.
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = 32;
  p.gpus_per_node = 8;
  p.seq_len = 131072;
  p.parallel.cp = 4;
  p.parallel.ep = 8;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  const ModelSpec m = model_for_plan(load_model(p.model, data_dir()), p);
  require_valid_plan(m, p);
  const Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  const Targets t = plan_targets(m, p, hw, "cpu", false);
  EXPECT_EQ(t.gemm_tokens.back(), 32768);             // local tokens: 128K / CP 4
  EXPECT_EQ(t.grouped_experts, 32);                   // 256 experts / EP 8
  EXPECT_EQ(t.grouped_hidden, 2048);
  EXPECT_EQ(t.grouped_ffn, 512);
  EXPECT_EQ(t.grouped_tokens.back(), 4096);           // 32768 x 8 / 32 experts per rank / 2 chunks
  EXPECT_EQ(t.attn_heads, 16);
  EXPECT_EQ(t.attn_kv_heads, 2);
  EXPECT_EQ(t.attn_head_dim, 256);
  EXPECT_EQ(t.attn_seqs.back(), 32768);
  EXPECT_EQ(t.la_value_heads, 32);
  EXPECT_EQ(t.ce_vocab, m.vocab);                     // TP 1: the whole vocabulary
  EXPECT_EQ(t.ce_tokens, (std::vector<int64_t>{32768}));
  EXPECT_EQ(t.moe_chunks, (std::vector<int>{1, 2}));
  EXPECT_EQ(t.moe_local_experts, 32);
  EXPECT_EQ(t.moe.top_k, 8);
  EXPECT_EQ(t.groups.ep, 8);
  EXPECT_EQ(t.groups.cp, 4);
  bool lm_head = false;
  for (const GemmClass& c : t.gemm_classes) lm_head |= c.name == "lm_head" && c.n == m.vocab && c.k == 2048;
  EXPECT_TRUE(lm_head);
  EXPECT_NE(t.plan.find("EP8"), std::string::npos);
}

TEST(Bus, FactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(Coll::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::AllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::AllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::SendRecv, 8), 1);
  EXPECT_DOUBLE_EQ(attention_head_dim_factor(128), 1.0);
  EXPECT_DOUBLE_EQ(attention_head_dim_factor(64), 0.75);
  EXPECT_DOUBLE_EQ(attention_head_dim_factor(256), 1.0);
}

}  // namespace
}  // namespace lcplan::profiler
