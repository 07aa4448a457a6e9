// Validation of one measured run against its plan (calibrate/validate_run.h): the estimate it compares with is
// estimate_memory's own per-phase breakdowns, so a run that measured exactly those has no error, whatever the
// precision (a low-precision recipe's weight copy once went missing from a second derivation here).
#include <gtest/gtest.h>

#include <string>

#include "calibrate/validate_run.h"
#include "common/data_dir.h"
#include "estimator/derived_plan.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"

namespace lcplan {
namespace {

Hardware h100() { return load_hardware("h100-sxm-80gb", data_dir()); }
Calibration exec_calibration() {
  return calibration_for(load_calibration("default", data_dir()), "h100-sxm-80gb", "lcplan-exec");
}

Plan qwen_plan(int gpus, int cp, int ep) {
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = gpus;
  p.seq_len = 131072;
  p.parallel.cp = cp;
  p.parallel.ep = ep;
  p.linear_ce = true;
  p.implementation = "lcplan-exec";
  return p;
}

// A record of a run that measured exactly the estimate: the peak, and every phase's total and categories.
Measurement exact_run(const Plan& p, const MemoryEstimate& est) {
  const StageMemory& st = est.stages[size_t(est.peak_stage)];
  Measurement m;
  m.plan = p;
  m.peak_bytes = est.peak_bytes;
  m.breakdown = st.breakdown;
  m.peak_phase = est.peak_phase;
  for (int ph = 0; ph < 4; ++ph) {
    if (Phase(ph) == Phase::Loss && st.stage != p.parallel.pp - 1) continue;
    MeasuredPhase mp;
    mp.peak_bytes = st.phase(Phase(ph)).total();
    mp.breakdown = st.phase(Phase(ph));
    mp.category_peaks = st.phase(Phase(ph));
    m.phases[size_t(ph)] = mp;
  }
  return m;
}

TEST(Compare, AnExactMeasurementHasNoError) {
  const ModelSpec model = load_model("qwen3.5-35b-a3b", data_dir());
  const Plan p = qwen_plan(4, 2, 4);
  ASSERT_FALSE(check_plan(model, p));
  const Calibration cal = exec_calibration();
  const Hardware hw = h100();
  const DerivedPlan d = derive_plan(model, p, hw);
  const MemoryEstimate est = estimate_memory(d, cal);
  Measurement m;
  m.plan = p;
  m.peak_bytes = est.peak_bytes;
  m.breakdown = est.stages[0].breakdown;
  m.peak_phase = est.peak_phase;
  const Comparison c = compare(model, p, hw, cal, m);
  EXPECT_EQ(worst_relative_error(c.at_peak, 0), 0);
  EXPECT_TRUE(c.notes.empty());
  EXPECT_NE(comparison_table(c).find("peak"), std::string::npos);
  EXPECT_TRUE(comparison_to_json(c).contains("breakdown_at_peak"));
}

// fp8 and nvfp4 plans (their weight copy in every phase's params), under FSDP and PP 2: every phase's estimate in
// the comparison is estimate_memory's breakdown of that phase, category by category, bit for bit.
TEST(Compare, LowPrecisionPhasesReachValidationUnchanged) {
  const ModelSpec model = load_model("qwen3.5-35b-a3b", data_dir());
  const Calibration cal = exec_calibration();
  ASSERT_GT(cal.low_precision_weight_bytes, 0);
  const Hardware hw = load_hardware("b200", data_dir());
  Plan bf16 = qwen_plan(16, 2, 4);
  bf16.parallel.pp = 2;
  bf16.optimizer_sharding = OptimizerSharding::Fsdp;
  bf16.recompute = Recompute::Full;
  const MemoryEstimate base = estimate_memory(derive_plan(model, bf16, hw), cal);
  for (Precision pr : {Precision::FP8, Precision::NVFP4}) {
    Plan p = bf16;
    p.precision = pr;
    ASSERT_FALSE(check_plan(model, p)) << to_string(pr);
    const MemoryEstimate est = estimate_memory(derive_plan(model, p, hw), cal);
    const StageMemory& st = est.stages[size_t(est.peak_stage)];
    // The weight copy is in the estimate (bf16 + the copy's bytes per resident parameter) ...
    EXPECT_DOUBLE_EQ(st.phase(Phase::Forward).params,
                     base.stages[size_t(est.peak_stage)].phase(Phase::Forward).params *
                         (2 + cal.low_precision_weight_bytes) / 2)
        << to_string(pr);
    // ... and validation compares the run with exactly these breakdowns.
    const Comparison c = compare(model, p, hw, cal, exact_run(p, est));
    ASSERT_FALSE(c.phases.empty());
    EXPECT_EQ(c.estimate_peak, est.peak_bytes);
    for (const PhaseRow& row : c.phases) {
      const MemoryBreakdown want = st.phase(row.phase);
      EXPECT_EQ(row.estimate, want.total()) << to_string(pr) << " " << to_string(row.phase);
      ASSERT_EQ(row.categories.size(), size_t(kMemoryCategoryCount));
      for (int i = 0; i < kMemoryCategoryCount; ++i) {
        const MemoryCategoryInfo& k = kMemoryCategories[size_t(i)];
        EXPECT_EQ(row.categories[size_t(i)].category, k.name);
        EXPECT_EQ(row.categories[size_t(i)].estimate, want.*k.member)
            << to_string(pr) << " " << to_string(row.phase) << " " << k.name;
      }
      EXPECT_EQ(worst_relative_error(row.categories, 0), 0) << to_string(pr) << " " << to_string(row.phase);
    }
    EXPECT_EQ(worst_relative_error(c.at_peak, 0), 0) << to_string(pr);
    const nlohmann::json j = comparison_to_json(c);
    EXPECT_EQ(j.at("breakdown_at_peak").at("params").at("estimate").get<double>(), st.breakdown.params);
  }
}

}  // namespace
}  // namespace lcplan
