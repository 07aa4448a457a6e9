// The per-phase breakdowns estimate_memory returns (StageMemory::phases, what `lcplan validate` compares a run
// with), and the table of memory categories every breakdown is read and written through.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/data_dir.h"
#include "estimator/calibration.h"
#include "estimator/derived_plan.h"
#include "estimator/estimate.h"
#include "estimator/hardware.h"
#include "estimator/memory_categories.h"
#include "estimator/memory_model.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"
#include "tests/common/toy_model.h"

using namespace lcplan;

namespace {

constexpr Phase kPhases[] = {Phase::Forward, Phase::Loss, Phase::Backward, Phase::Optimizer};

// Each stage's peak breakdown is its peak phase's and no phase exceeds the peak, for plans covering each option and
// every precision (a low-precision recipe adds its weight copy to every phase).
TEST(MemoryPhases, ThePeakIsTheLargestPhase) {
  const Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  int checked = 0;
  for (const char* impl : {"lcplan-exec", "megatron", "bumblebee"}) {
    const Calibration cal = calibration_for(load_calibration("default", data_dir()), hw.name, impl);
    for (const char* name : {"qwen3.5-35b-a3b", "llama-3.1-70b", "deepseek-v3"}) {
      const ModelSpec m = load_model(name, data_dir());
      const bool moe = m.moe.num_experts > 0;
      for (OptimizerSharding sh : {OptimizerSharding::None, OptimizerSharding::DistOpt, OptimizerSharding::Fsdp})
        for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
          for (int pp : {1, 2})
            for (bool lce : {false, true})
              for (Precision pr : {Precision::BF16, Precision::FP8, Precision::NVFP4}) {
                Plan p;
                p.model = name;
                p.gpus = 64;
                p.seq_len = 32768;
                p.parallel.pp = pp;
                p.parallel.cp = 2;
                p.parallel.tp = 2;
                p.parallel.ep = moe ? 8 : 1;
                p.optimizer_sharding = sh;
                p.recompute = rc;
                p.linear_ce = lce;
                p.precision = pr;
                p.moe.ep_chunks = moe ? 2 : 1;
                if (check_plan(m, p)) continue;
                const MemoryEstimate est = estimate_memory(derive_plan(m, p, hw), cal);
                for (const StageMemory& st : est.stages) {
                  const MemoryBreakdown a = st.phase(st.peak_phase);
                  EXPECT_DOUBLE_EQ(a.total(), st.peak_bytes) << name << " stage " << st.stage;
                  EXPECT_DOUBLE_EQ(a.activations, st.breakdown.activations);
                  EXPECT_DOUBLE_EQ(a.moe_buffers, st.breakdown.moe_buffers);
                  EXPECT_DOUBLE_EQ(a.fsdp_buffers, st.breakdown.fsdp_buffers);
                  EXPECT_DOUBLE_EQ(a.logits, st.breakdown.logits);
                  for (const MemoryCategoryInfo& c : kMemoryCategories)
                    EXPECT_EQ(a.*c.member, st.breakdown.*c.member) << name << " " << c.name;
                  for (Phase ph : kPhases) EXPECT_LE(st.phase(ph).total(), st.peak_bytes * (1 + 1e-12));
                  if (st.stage != pp - 1) {
                    EXPECT_EQ(st.phase(Phase::Loss).total(), 0) << "no loss before the last stage";
                  }
                  ++checked;
                }
              }
    }
  }
  EXPECT_GT(checked, 100);
}

// Which terms each phase holds, on the toy model under FSDP with two stages (README "What each number means").
TEST(MemoryPhases, EachPhaseHoldsItsTerms) {
  const ModelSpec m = lcplan::testing::toy_model();
  Plan p;
  p.model = "toy";
  p.gpus = 4;
  p.seq_len = 128;
  p.parallel.pp = 2;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  ASSERT_FALSE(check_plan(m, p));
  Calibration cal = lcplan::testing::bare_calibration();
  cal.fragmentation = 0.25;
  const MemoryEstimate e = estimate_memory(m, p, lcplan::testing::toy_hardware(), cal);
  for (const StageMemory& st : e.stages) {
    const MemoryBreakdown fwd = st.phase(Phase::Forward);
    const MemoryBreakdown bwd = st.phase(Phase::Backward);
    const MemoryBreakdown opt = st.phase(Phase::Optimizer);
    // The optimizer step holds the static state only.
    EXPECT_GT(opt.params, 0);
    EXPECT_EQ(opt.params, fwd.params);
    EXPECT_EQ(opt.activations + opt.logits + opt.moe_buffers + opt.fsdp_buffers + opt.fragmentation, 0);
    // The backward adds the unit's unsharded gradient to the gathered units, and never holds less activation.
    EXPECT_GT(fwd.fsdp_buffers, 0);
    EXPECT_GT(bwd.fsdp_buffers, fwd.fsdp_buffers);
    EXPECT_GE(bwd.activations, fwd.activations);
    EXPECT_EQ(bwd.moe_buffers, fwd.moe_buffers);
    EXPECT_EQ(fwd.logits, 0);
    for (Phase ph : kPhases) {
      const MemoryBreakdown b = st.phase(ph);
      EXPECT_DOUBLE_EQ(b.fragmentation, 0.25 * (b.activations + b.logits + b.moe_buffers + b.fsdp_buffers));
    }
  }
  EXPECT_EQ(e.stages[0].phase(Phase::Loss).total(), 0);
  const MemoryBreakdown loss = e.stages[1].phase(Phase::Loss);
  EXPECT_DOUBLE_EQ(loss.logits, 128 * 1000 * 4.0);  // fp32 logits tokens x vocab
  EXPECT_EQ(loss.moe_buffers, 0);
  EXPECT_EQ(loss.activations, e.stages[1].phase(Phase::Forward).activations);
}

// One row per MemoryBreakdown member, distinct names and columns, and total() is the sum of the rows.
TEST(MemoryCategories, TheTableCoversTheBreakdown) {
  static_assert(sizeof(MemoryBreakdown) == kMemoryCategoryCount * sizeof(double), "a row per member");
  MemoryBreakdown b;
  std::set<std::string> names, columns;
  double want = 0;
  for (int i = 0; i < kMemoryCategoryCount; ++i) {
    const MemoryCategoryInfo& c = kMemoryCategories[size_t(i)];
    EXPECT_EQ(b.*c.member, 0) << c.name << " shares a member with an earlier row";
    b.*c.member = double(1 << i);
    want += double(1 << i);
    names.insert(c.name);
    columns.insert(c.column);
    EXPECT_LE(std::string(c.column).size(), 7u) << c.name;
    EXPECT_FALSE(std::string(c.meaning).empty()) << c.name;
  }
  EXPECT_EQ(names.size(), size_t(kMemoryCategoryCount));
  EXPECT_EQ(columns.size(), size_t(kMemoryCategoryCount));
  EXPECT_EQ(b.total(), want);
  // The record writer names every category.
  const nlohmann::json j = breakdown_to_json(b);
  ASSERT_EQ(j.size(), size_t(kMemoryCategoryCount));
  for (const MemoryCategoryInfo& c : kMemoryCategories) EXPECT_EQ(j.at(c.name).get<double>(), b.*c.member);
}

}  // namespace

// A peak inside capacity whose error band's upper end is not says so: "MAY NOT FIT", neither "FITS" nor "DOES NOT
// FIT" (estimate_table's verdict; Estimate::fits is the band's, fits_at_estimate the peak's).
TEST(MemoryPhases, APeakWhoseBandExceedsCapacityMayNotFit) {
  Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  Calibration cal = calibration_for(load_calibration("default", data_dir()), hw.name, "megatron");
  cal.memory_band = {-0.5, 0.0, 10, "test: measured up to 2x the estimate", {}};
  const ModelSpec m = load_model("llama-3.1-8b", data_dir());
  Plan p;
  p.model = m.name, p.hardware = hw.name, p.gpus = 8, p.seq_len = 8192;
  ASSERT_EQ(check_plan(m, p), std::nullopt);
  const double peak = estimate(m, p, hw, cal).memory.peak_bytes;
  struct Case {
    double capacity;
    const char* verdict;
    bool fits, at_estimate;
  };
  for (const Case& c : {Case{3 * peak, "-> FITS\n", true, true}, Case{1.5 * peak, "-> MAY NOT FIT", false, true},
                        Case{0.5 * peak, "-> DOES NOT FIT\n", false, false}}) {
    hw.hbm_bytes = c.capacity;
    const Estimate e = estimate(m, p, hw, cal);
    EXPECT_EQ(e.fits, c.fits);
    EXPECT_EQ(e.fits_at_estimate, c.at_estimate);
    const std::string table = estimate_table(e, p, m, hw);
    EXPECT_NE(table.find(c.verdict), std::string::npos) << table;
  }
}

