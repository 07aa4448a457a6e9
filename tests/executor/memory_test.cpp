// Measured memory of lcplan-exec against the estimate of the same scaled plan with the executor's calibration
// profile (data/calibration/default.json, per_implementation lcplan-exec): the peak and every category of its breakdown within 5%, for a table
// of plans covering each option. A mismatch prints both breakdowns.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>

#include "calibrate/validate_run.h"
#include "kernels/comm/helpers.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

std::string row(const char* what, const MemoryBreakdown& b) {
  char s[512];
  std::snprintf(s, sizeof s,
                "%-9s params %9.0f grads %9.0f opt %9.0f fsdp %9.0f act %9.0f logits %9.0f moe %9.0f ws %11.0f total %11.0f",
                what, b.params, b.grads, b.optimizer, b.fsdp_buffers, b.activations, b.logits, b.moe_buffers,
                b.workspace, b.total());
  return s;
}

class MemoryTable : public ::testing::TestWithParam<ExecCase> {};

TEST_P(MemoryTable, WithinFivePercent) {
  helpers::World w;
  const ExecCase& mc = GetParam();
  const ModelSpec full = zoo(mc.model);
  const ScaledCase sc = executor_case(full, make_plan(mc.model, mc.args), {mc.scale, mc.layers});
  const ExecResult r = run_case(w.c, sc);
  const Calibration cal = exec_calibration();
  const Hardware hw = h100();
  // Every pipeline stage on its own: its busiest rank's peak phase against the estimate of that stage and phase.
  for (int stage = 0; stage < sc.plan.parallel.pp; ++stage) {
    int rank = -1;
    Phase phase = Phase::Forward;
    double best = -1;
    for (const RankReport& rr : r.ranks)
      for (int ph = 0; ph < kPhases; ++ph)
        if (rr.stage == stage && rr.phases[ph].seen && rr.phases[ph].at_peak.total() > best) {
          best = rr.phases[ph].at_peak.total();
          rank = rr.rank;
          phase = Phase(ph);
        }
    ASSERT_GE(rank, 0) << mc.name << " stage " << stage;
    const MemoryBreakdown at_peak = r.ranks[rank].phases[int(phase)].at_peak.to_breakdown();
    // Categories are compared at their own maxima within the peak phase (the estimator's phase terms are maxima: the
    // largest rebuilt layer, the MoE buffers at the busiest rank's load), the total at the peak instant.
    const MemoryBreakdown meas = r.ranks[rank].phases[int(phase)].category_max.to_breakdown();
    // The estimate of the plan at the routing load the stage had (tiny token counts route unevenly; the estimator's
    // routing_imbalance is that load).
    Plan plan = sc.plan;
    plan.moe.routing_imbalance = stage_load(r, stage);
    const DerivedPlan d = derive_plan(sc.model, plan, hw);
    const MemoryEstimate est = estimate_memory(d, cal);
    const MemoryBreakdown e = est.stages[size_t(stage)].phase(phase);
    std::vector<CategoryRow> rows_;  // the categories the executor tracks
    for (int c = 0; c < kCategories; ++c) {
      const MemoryCategoryInfo& k = kMemoryCategories[size_t(c)];
      rows_.push_back({k.name, e.*k.member, meas.*k.member});
    }
    const double worst = worst_relative_error(rows_, 4096);
    const double peak_err = std::abs(at_peak.total() / est.stages[size_t(stage)].peak_bytes - 1);
    char head[160];
    std::snprintf(head, sizeof head, " stage %d (in-flight %.2f, routing load %.3f)", stage,
                  est.stages[size_t(stage)].inflight_microbatches, plan.moe.routing_imbalance);
    const std::string table = row("estimate", e) + " phase " + to_string(phase) + ", stage peak phase " +
                              to_string(est.stages[size_t(stage)].peak_phase) + head + "\n" +
                              row("measured", meas) + " (category maxima)\n" + row("at peak", at_peak) + " phase " +
                              to_string(phase) + " rank " + std::to_string(rank) + ", workspace high-water " +
                              std::to_string(long(r.ranks[rank].workspace_high_water));
    if (w.c.rank == 0) std::printf("%s\n%s\n", mc.name, table.c_str());
    // Every category of the stage's measured peak within 5% of the estimate of that phase, and the stage's measured
    // peak within 5% of its estimated peak (the phases agree up to ties).
    EXPECT_LT(worst, 0.05) << mc.name << "\n" << table;
    EXPECT_LT(peak_err, 0.05) << mc.name << "\n" << table;
    // The reservation held every temporary: the workspace category is honest.
    EXPECT_LE(r.ranks[rank].workspace_high_water, cal.workspace_bytes) << mc.name;
  }
}

PlanArgs pa(int gpus, int cp, int ep, OptimizerSharding s, Recompute rc, bool lce, int chunks = 1, int64_t seq = 32768,
            int tp = 1, int pp = 1, int vpp = 1) {
  PlanArgs a;
  a.tp = tp;
  a.pp = pp;
  a.vpp = vpp;
  a.gpus = gpus;
  a.cp = cp;
  a.ep = ep;
  a.sharding = s;
  a.recompute = rc;
  a.linear_ce = lce;
  a.ep_chunks = chunks;
  a.seq = seq;  // 512 tokens per sequence at scale 64 by default: routing within a few percent of balanced per layer
  return a;
}

using OS = OptimizerSharding;
using RC = Recompute;
const ExecCase kCases[] = {
    {"qwen_single_none", "qwen3.5-35b-a3b", pa(1, 1, 1, OS::None, RC::None, true)},
    {"qwen_single_materialized", "qwen3.5-35b-a3b", pa(1, 1, 1, OS::None, RC::None, false)},
    {"qwen_dp4_distopt", "qwen3.5-35b-a3b", pa(4, 1, 1, OS::DistOpt, RC::None, true)},
    {"qwen_dp4_fsdp", "qwen3.5-35b-a3b", pa(4, 1, 1, OS::Fsdp, RC::None, true)},
    {"qwen_cp2_selective", "qwen3.5-35b-a3b", pa(2, 2, 1, OS::None, RC::Selective, true)},
    {"qwen_ep2_full", "qwen3.5-35b-a3b", pa(2, 1, 2, OS::DistOpt, RC::Full, true, 1, 131072)},
    {"qwen_ep4_chunk2", "qwen3.5-35b-a3b", pa(4, 1, 4, OS::DistOpt, RC::None, true, 2)},
    {"qwen_reference", "qwen3.5-35b-a3b", pa(4, 2, 4, OS::Fsdp, RC::Full, true, 2, 131072)},
    {"llama_single_none", "llama-3.1-8b", pa(1, 1, 1, OS::None, RC::None, true)},
    {"llama_cp2_fsdp_selective", "llama-3.1-8b", pa(4, 2, 1, OS::Fsdp, RC::Selective, false)},
    // Pipeline stages: 1F1B holds pp - stage microbatches, the interleaved schedule Megatron's warmup plus one.
    {"qwen_pp2_dp2", "qwen3.5-35b-a3b", pa(4, 1, 1, OS::DistOpt, RC::None, true, 1, 32768, 1, 2), 64, 2},
    {"qwen_pp4_full", "qwen3.5-35b-a3b", pa(4, 1, 1, OS::None, RC::Full, true, 1, 32768, 1, 4), 64, 2},
    {"llama_pp4_vpp2", "llama-3.1-8b", pa(4, 1, 1, OS::DistOpt, RC::None, true, 1, 32768, 1, 4, 2), 64, 8},
    {"llama_pp2_vpp2_fsdp_sel", "llama-3.1-8b", pa(4, 1, 1, OS::Fsdp, RC::Selective, false, 1, 32768, 1, 2, 2), 64, 4},
    // Tensor parallelism with sequence parallelism (and with PP, EP, ETP).
    {"qwen_tp2_dp2_selective", "qwen3.5-35b-a3b", pa(4, 1, 1, OS::DistOpt, RC::Selective, true, 1, 32768, 2)},
    {"qwen_tp2_ep2_pp2", "qwen3.5-35b-a3b", pa(4, 1, 2, OS::None, RC::None, true, 1, 32768, 2, 2), 64, 2},
    {"llama_tp4_materialized", "llama-3.1-8b", pa(4, 1, 1, OS::None, RC::None, false, 1, 32768, 4)},
    {"llama_tp2_pp2_fsdp_full", "llama-3.1-8b", pa(4, 1, 1, OS::Fsdp, RC::Full, true, 1, 32768, 2, 2), 64, 2},
    // Multi-head latent attention (DeepSeek-V3), under TP, CP and EP. Moonlight is left out: its two shared experts'
    // fp32 kernel state puts lcplan-exec's MoE buffers 19% above the estimate's calibrated count (README known gaps).
    {"deepseek_ep4_distopt", "deepseek-v3", pa(4, 1, 4, OS::DistOpt, RC::None, true)},
    {"glm_tp2_ep2_selective", "glm-4.5", pa(4, 1, 2, OS::DistOpt, RC::Selective, true, 1, 32768, 2)},
    {"deepseek_tp2_cp2_selective", "deepseek-v3", pa(4, 2, 2, OS::None, RC::Selective, true, 1, 32768, 2)},
    {"qwen_tp2_ep2_full", "qwen3.5-35b-a3b", pa(4, 1, 2, OS::DistOpt, RC::Full, true, 1, 32768, 2)},
};

INSTANTIATE_TEST_SUITE_P(Plans, MemoryTable, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace lcplan::exec::tests
