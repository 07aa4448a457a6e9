// Frameworks as capability tables (estimator/frameworks.h): the search walks only what the plan's framework runs,
// `estimate` refuses the rest with one sentence naming the field and the frameworks that run it, and the top plan of
// every search, launched as its framework launches it (Megatron-LM flags for megatron and megatron-bridge, recipe.json
// for bumblebee and lcplan-exec) and read back, predicts the same step time and peak (within 0.5%) for every zoo model.
#include <gtest/gtest.h>

#include <cmath>

#include "common/data_dir.h"
#include "parallel/chunk_schedule.h"
#include "estimator/frameworks.h"
#include "models/params.h"
#include "models/zoo.h"
#include "search/megatron_args.h"
#include "search/search.h"

using namespace lcplan;

namespace {

// The plan as its framework's launch carries it, read back: flags for Megatron-LM, recipe.json otherwise. Fields no
// flag carries (the cluster's hardware and NVLink domain, the framework) stay the plan's; the run settings the flags
// leave out take the framework's defaults, as at load.
Plan launched(const Plan& p, const ModelSpec& m, const Calibration& cal) {
  const Framework* fw = find_framework(p.implementation);
  Plan back;
  if (std::string(fw->launch) == "megatron") {
    const MegatronLaunch l = parse_megatron_args(megatron_flags(p, m));
    EXPECT_TRUE(l.ignored.empty()) << l.ignored.front();
    EXPECT_TRUE(l.notes.empty()) << l.notes.front();
    back = finish_megatron_plan(l, m, p.gpus);
    back.model = p.model, back.hardware = p.hardware, back.gpus_per_node = p.gpus_per_node;
    back.implementation = p.implementation;
  } else {
    back = plan_from_json(plan_to_json(p));
  }
  resolve_run_defaults(back, m, cal);
  return back;
}

struct SearchCase {
  ModelSpec model;
  Plan base;
  PlanSpace space;
};

// A search small enough for a test: 4K tokens, one sequence per GPU, enough GPUs for the model's size.
SearchCase setup_for(const std::string& name, const std::string& framework, const Calibration& cal) {
  SearchCase s;
  s.model = load_model(name, data_dir());
  const double params = count_params(s.model).total;
  s.base.model = name;
  s.base.gpus = params < 50e9 ? 16 : params < 200e9 ? 64 : 256;
  s.base.seq_len = 4096;
  s.base.global_batch = s.base.gpus;
  s.base.implementation = framework;
  s.base.gpus_per_node = 8;
  s.base.assumed = kPlanDefaultFields;
  resolve_run_defaults(s.base, s.model, cal, /*recommended=*/true);
  s.space = default_space(s.model, s.base);
  s.space.tp = {1, 2};
  s.space.pp = {1, 2, 4, 8};
  s.space.vpp = {1, 2};
  s.space.cp = {1};
  s.space.micro_batch = {1};
  return s;
}

}  // namespace

TEST(Frameworks, TheSearchWalksWhatTheFrameworkRuns) {
  const ModelSpec m = load_model("qwen3.5-35b-a3b", data_dir());
  Plan p;
  p.model = m.name, p.gpus = 32, p.seq_len = 131072, p.gpus_per_node = 8;
  p.implementation = "megatron";
  PlanSpace s = default_space(m, p);
  EXPECT_EQ(s.ep_chunks, std::vector<int>{1});               // no chunked EP in Megatron-LM
  EXPECT_EQ(s.a2a_overlap, (std::vector<bool>{false, true}));  // its cross-microbatch EP overlap
  EXPECT_EQ(s.offload_optimizer, std::vector<bool>{false});   // needs the precision-aware optimizer
  p.optimizer.precision_aware = true;
  EXPECT_EQ(default_space(m, p).offload_optimizer, (std::vector<bool>{false, true}));
  p.implementation = "bumblebee";
  s = default_space(m, p);
  EXPECT_EQ(s.ep_chunks.size(), size_t(moe::kMaxChunks));
  EXPECT_EQ(s.a2a_overlap, std::vector<bool>{false});
  p.implementation = "lcplan-exec";
  EXPECT_EQ(default_space(m, p).offload_optimizer, std::vector<bool>{false});
}

TEST(Frameworks, RefusalsNameTheFieldAndWhoRunsIt) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p;
  p.model = m.name, p.gpus = 16, p.seq_len = 4096;
  p.parallel.ep = 8;
  p.moe.ep_chunks = 2;
  EXPECT_EQ(framework_support_error(m, p),
            "moe.ep_chunks = 2 (chunked EP) is not something megatron runs (run by bumblebee, lcplan-exec)");
  p.moe.ep_chunks = 1;
  p.implementation = "lcplan-exec";
  p.moe.dispatcher = MoeDispatcher::DeepEP;
  EXPECT_EQ(framework_support_error(m, p),
            "moe.dispatcher = deepep is not something lcplan-exec runs (run by megatron, megatron-bridge)");
  // lcplan-exec runs lcplan's selective set and fp32 gradients only, and no token dropping.
  p.moe.dispatcher = MoeDispatcher::AllToAll;
  p.optimizer.grad = Dtype::BF16;
  EXPECT_NE(framework_support_error(m, p).find("optimizer.grad_dtype = bf16"), std::string::npos);
  p.optimizer.grad = Dtype::FP32;
  p.recompute = Recompute::Selective;
  p.recompute_modules = kRecomputeCoreAttn;
  EXPECT_NE(framework_support_error(m, p).find("recompute_modules = core_attn"), std::string::npos);
  p.recompute_modules = kLegacySelectiveModules;
  p.moe.capacity_factor = 1.25;
  EXPECT_NE(framework_support_error(m, p).find("moe.capacity_factor"), std::string::npos);
  p.moe.capacity_factor = 0;
  EXPECT_EQ(framework_support_error(m, p), "");
  // Megatron-LM offloads the optimizer with the precision-aware optimizer only.
  p.implementation = "megatron";
  p.offload.optimizer = true;
  EXPECT_NE(framework_support_error(m, p).find("precision_aware"), std::string::npos);
}

// The top plan of every search, launched and read back, predicts the same step time and peak within 0.5%.
TEST(Frameworks, TopPlanLaunchedAndReadBackPredictsTheSame) {
  const Hardware hw = load_hardware("h100-sxm-80gb", data_dir());
  const Calibration profile = load_calibration("default", data_dir());
  int compared = 0;
  for (const std::string& name : zoo_names(data_dir())) {
    for (const char* framework : {"megatron", "megatron-bridge", "bumblebee", "lcplan-exec"}) {
      SCOPED_TRACE(name + " / " + framework);
      const Calibration cal = calibration_for(profile, hw.name, framework);
      SearchCase s = setup_for(name, framework, cal);
      SearchOptions opt;
      opt.top_k = 1;
      const Framework* fw = find_framework(framework);
      if (fw->can.limits) opt.admit = [&](const Plan& p) { return fw->can.limits(s.model, p).empty(); };
      const SearchResult r = search_plans(s.model, s.base, s.space, hw, cal, opt);
      if (r.top.empty()) continue;  // nothing this framework runs fits this model here (lcplan-exec and gpt-oss)
      const Plan& top = r.top.front().plan;
      ASSERT_EQ(framework_support_error(s.model, top), "");
      const Plan back = launched(top, s.model, cal);
      ASSERT_EQ(framework_support_error(s.model, back), "");
      const Estimate a = r.top.front().estimate, b = estimate(s.model, back, hw, cal);
      EXPECT_NEAR(b.time.step_seconds / a.time.step_seconds, 1.0, 0.005) << megatron_plan_difference(top, back);
      EXPECT_NEAR(b.memory.peak_bytes / a.memory.peak_bytes, 1.0, 0.005) << megatron_plan_difference(top, back);
      ++compared;
    }
  }
  EXPECT_GE(compared, 50);  // 18 models x 4 frameworks, less what lcplan-exec cannot run
}
