// The search over variable-length batches (search/batch_search.h): for a heavy-tailed distribution the chosen plan
// fits its fullest microbatch, its expected step is printed with the straggler share, and one length is the
// fixed-length search's best plan.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "common/data_dir.h"
#include "models/zoo.h"
#include "search/batch_search.h"
#include "tests/common/zoo_profile.h"

using namespace lcplan;

namespace {

// A lognormal of median 16K capped at 128K, as rollouts of a long-context RL run (fixed draws, 2,000 sequences).
LengthDistribution heavy_tail() {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> z(std::log(16384.0), 1.0);
  std::map<int64_t, double> counts;
  for (int i = 0; i < 2000; ++i) counts[std::clamp<int64_t>(int64_t(std::exp(z(rng))), 256, 131072)] += 1;
  LengthDistribution d;
  for (const auto& [l, c] : counts) d.lengths.push_back(l), d.weights.push_back(c);
  return d;
}

struct BatchSearch : ::testing::Test, lcplan::testing::ZooProfile {
  ModelSpec m = load_model("qwen3.5-35b-a3b", data_dir());
  Plan base() const {
    Plan p;
    p.model = "qwen3.5-35b-a3b";
    p.gpus = 32;
    p.seq_len = 131072;
    p.global_batch = 64;
    p.implementation = "bumblebee";
    p.gpus_per_node = 8;
    return p;
  }
  // The heavy tail over 8 drawn steps, the best 5 plans.
  PackingOptions packing() const {
    PackingOptions o;
    o.samples = 8;
    return o;
  }
  SearchOptions options() const {
    SearchOptions opt;
    opt.top_k = 5;
    return opt;
  }
  BatchSearchResult searched() const {
    const Plan p = base();
    return search_batches(m, p, default_space(m, p), hw, cal(p), options(), heavy_tail(), packing());
  }
};

}  // namespace

TEST_F(BatchSearch, TheChosenPlanFitsItsFullestMicrobatch) {
  const Plan p = base();
  const SearchOptions opt = options();
  const BatchSearchResult r = searched();
  ASSERT_FALSE(r.top.empty());
  EXPECT_GT(r.searches, 1u);
  for (size_t i = 0; i < r.top.size(); ++i) {
    const BatchCandidate& b = r.top[i];
    SCOPED_TRACE(i);
    EXPECT_TRUE(b.batches.fits);
    EXPECT_LE(b.batches.peak_max_bytes, hw.hbm_bytes);
    // The fullest microbatch holds the longest sequence within the budget.
    EXPECT_GE(b.tokens_per_microbatch * b.plan.parallel.cp, 131072);
    EXPECT_GT(b.batches.step_mean, 0);
    EXPECT_GE(b.batches.straggler_share, 0);
    if (i) {
      EXPECT_GE(r.top[i - 1].batches.tokens_per_second_per_gpu, b.batches.tokens_per_second_per_gpu);
    }
  }
  // Shorter sequences than 128K cost less attention per token: the best plan beats the fixed 128K search's tokens/s.
  Plan fixed = p;
  const SearchResult f = search_plans(m, fixed, default_space(m, fixed), hw, cal(p), opt);
  ASSERT_FALSE(f.top.empty());
  EXPECT_GT(r.top.front().batches.tokens_per_second_per_gpu, f.top.front().estimate.time.tokens_per_second_per_gpu);
}

// The reduced recipe over batches reads the article's local-sequence rule as local tokens per microbatch: the
// longest sequence's share within the target, microbatches of the target's tokens per GPU, and it never beats the
// search (whose candidates include its layout) by more than the re-ranking's noise.
TEST_F(BatchSearch, TheReducedRecipeKeepsLocalTokensPerMicrobatchAtTheTarget) {
  const Plan p = base();
  const SearchOptions opt = options();
  const BatchSearchResult r = searched();
  const RecipeRules rules;
  const BatchRecipe recipe = reduce_batch_recipe(m, p, hw, cal(p), opt, heavy_tail(), packing(), r, rules);
  ASSERT_TRUE(recipe.found) << (recipe.broken.empty() ? "" : recipe.broken.front());
  const Plan& q = recipe.plan.plan;
  EXPECT_LE(double(q.seq_len) / q.parallel.cp, double(rules.target_local_seq_max));  // the longest share
  EXPECT_GT(double(q.seq_len) / (q.parallel.cp / 2.0), double(rules.target_local_seq_max));  // the least such CP
  EXPECT_EQ(recipe.plan.tokens_per_microbatch, rules.target_local_seq_max);
  ASSERT_TRUE(q.batches);
  EXPECT_EQ(q.batches->packing.tokens_per_microbatch, rules.target_local_seq_max);
  EXPECT_LE(recipe.plan.batches.peak_max_bytes + opt.headroom_bytes, hw.hbm_bytes);
  ASSERT_FALSE(r.top.empty());
  EXPECT_NEAR(recipe.throughput_gap,
              1 - recipe.plan.batches.tokens_per_second_per_gpu / r.top.front().batches.tokens_per_second_per_gpu, 1e-12);
  EXPECT_GT(recipe.throughput_gap, -0.05);
  const std::string text = batch_recipe_text(recipe);
  EXPECT_NE(text.find("CP " + std::to_string(q.parallel.cp)), std::string::npos) << text;
  EXPECT_NE(text.find("tokens per GPU per microbatch"), std::string::npos) << text;
}

// A budget only caps a microbatch: a small batch (32 sequences over 4-8 DP ranks) packs every drawn step the same at
// 2 and 4 times the least budget, and the table shows that run once, at the smaller budget.
TEST_F(BatchSearch, OneRunIsOneRowWhateverItsBudget) {
  Plan p = base();
  p.global_batch = 32;
  p.implementation = "megatron";
  LengthDistribution d;
  d.lengths = {4096, 16384, 65536, 131072};
  d.weights = {200, 64, 16, 8};
  SearchOptions opt = options();
  opt.top_k = 10;
  const BatchSearchResult r = search_batches(m, p, default_space(m, p), hw, cal(p), opt, d, packing());
  ASSERT_GT(r.top.size(), 1u);
  auto layout = [](const Plan& q) {
    nlohmann::json j = plan_to_json(q);
    j.erase("batches");
    return j.dump();
  };
  for (size_t i = 0; i < r.top.size(); ++i)
    for (size_t j = i + 1; j < r.top.size(); ++j) {
      const BatchCandidate &a = r.top[i], &b = r.top[j];
      const bool same = layout(a.plan) == layout(b.plan) && a.batches.step_mean == b.batches.step_mean &&
                        a.batches.peak_max_bytes == b.batches.peak_max_bytes;
      EXPECT_FALSE(same) << "rows " << i << " and " << j << " are one run at budgets " << a.tokens_per_microbatch
                         << " and " << b.tokens_per_microbatch;
      if (same) {
        EXPECT_LT(a.tokens_per_microbatch, b.tokens_per_microbatch);
      }
    }
}
