// Under every shipped profile (default for each implementation it describes, and the priors) the article's measured
// directions hold for the reference case, Qwen3.5-35B-A3B on 32 x H100 at 128K (article section 2.5):
// linear CE and FSDP lower the peak, chunked EP speeds up the 128K recipe, and PP 1 beats PP 2 there.
#include <gtest/gtest.h>

#include "common/data_dir.h"
#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"

namespace lcplan {
namespace {

struct Profile {
  std::string name;
  Calibration cal;
};

std::vector<Profile> shipped(const std::string& hw) {
  const Calibration def = load_calibration("default", data_dir());
  std::vector<Profile> out;
  for (const char* impl : {"megatron", "bumblebee"}) out.push_back({std::string("default/") + impl, calibration_for(def, hw, impl)});
  out.push_back({"priors", calibration_for(load_calibration("priors", data_dir()), hw, "megatron")});
  return out;
}

// The article's recipe: TP1 PP1 EP8 CP4, FSDP, full recompute, linear CE, 2 EP chunks.
Plan recipe() {
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = 32;
  p.seq_len = 131072;
  p.parallel = {1, 1, 1, 4, 8, 1};
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  p.global_batch = 64;
  return p;
}

struct Fixture : ::testing::TestWithParam<int> {
  ModelSpec m = load_model("qwen3.5-35b-a3b", data_dir());
  Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  Profile prof = shipped(hw.name).at(GetParam());
  Estimate of(const Plan& p) const { return estimate(m, p, hw, prof.cal); }
};

TEST_P(Fixture, LinearCeAndFsdpLowerThePeak) {
  Plan p = recipe();
  const double with_both = of(p).memory.peak_bytes;
  p.linear_ce = false;
  EXPECT_GT(of(p).memory.peak_bytes, with_both) << prof.name << ": materialized logits";
  p = recipe();
  p.optimizer_sharding = OptimizerSharding::DistOpt;
  EXPECT_GT(of(p).memory.peak_bytes, with_both) << prof.name << ": distributed optimizer instead of FSDP";
}

TEST_P(Fixture, ChunkedEpSpeedsUpThe128kRecipe) {
  Plan p = recipe();
  const double chunked = of(p).time.tflops_per_gpu;
  p.moe.ep_chunks = 1;
  EXPECT_GT(chunked, of(p).time.tflops_per_gpu) << prof.name;
}

TEST_P(Fixture, Pp1BeatsPp2) {
  Plan p = recipe();
  const double pp1 = of(p).time.tflops_per_gpu;
  p.parallel.pp = 2;
  EXPECT_GT(pp1, of(p).time.tflops_per_gpu) << prof.name;
}

INSTANTIATE_TEST_SUITE_P(ShippedProfiles, Fixture, ::testing::Values(0, 1, 2));

// The same chip with more memory bandwidth is never slower: every zoo model's reduced layout on 32 H200 (the H100 die
// with HBM3e, data/hardware/h200.json) takes at most the time it takes on 32 H100, under the default profile.
TEST(Consistency, AnH200IsNoSlowerThanAnH100) {
  const Calibration def = load_calibration("default", data_dir());
  const Hardware h100 = load_hardware("h100-sxm-80gb", data_dir()), h200 = load_hardware("h200", data_dir());
  int compared = 0;
  for (const std::string& name : zoo_names(data_dir())) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name, data_dir());
    Plan p;
    p.model = name;
    p.gpus = 32;
    p.seq_len = 8192;
    p.global_batch = 64;
    p.parallel.ep = m.moe.num_experts > 0 ? 8 : 1;
    p.optimizer_sharding = OptimizerSharding::Fsdp;
    p.recompute = Recompute::Full;
    if (check_plan(m, p)) continue;
    const double t100 = estimate_time(m, p, h100, calibration_for(def, h100, p.implementation)).step_seconds;
    const double t200 = estimate_time(m, p, h200, calibration_for(def, h200, p.implementation)).step_seconds;
    EXPECT_LE(t200, t100 * (1 + 1e-9));
    ++compared;
  }
  EXPECT_GE(compared, 15);
}

}  // namespace
}  // namespace lcplan
