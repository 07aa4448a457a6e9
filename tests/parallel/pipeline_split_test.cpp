// Pipeline splits: Megatron-LM's even and embedding-and-loss rules, first/last stage counts, explicit lists, the
// balanced default for layer counts neither even rule splits, and one-sentence errors.
#include <gtest/gtest.h>

#include <numeric>

#include "parallel/pipeline_split.h"

namespace lcplan {
namespace {

int sum(const PipelineSplit& s) { return std::accumulate(s.layers.begin(), s.layers.end(), 0); }

TEST(PipelineSplit, Even) {
  const SplitResult r = split_layers(40, 4, 1);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.split.rule, SplitRule::Even);
  EXPECT_EQ(r.split.layers, std::vector<int>(4, 10));
  const std::vector<LayerPlace> at = place_layers(r.split);
  EXPECT_EQ(at[9].stage, 0);
  EXPECT_EQ(at[10].stage, 1);
  EXPECT_EQ(at[10].pos, 0);
}

TEST(PipelineSplit, EmbeddingAndLossCountAsLayers) {
  // Llama-3.1-405B: 126 layers over pp 8 x vpp 8 = 64 virtual stages only with the embedding and loss counted:
  // 128 / 64 = 2 per virtual stage, the first and last hold 1.
  const SplitResult r = split_layers(126, 8, 8);
  ASSERT_TRUE(r.ok) << r.error;
  const PipelineSplit& s = r.split;
  EXPECT_EQ(s.rule, SplitRule::EmbeddingAndLoss);
  EXPECT_EQ(s.max_chunk_layers(), 2);
  EXPECT_EQ(s.layers_in(0), 1);
  EXPECT_EQ(s.layers_in(63), 1);
  EXPECT_EQ(sum(s), 126);
  const std::vector<LayerPlace> at = place_layers(s);
  ASSERT_EQ(at.size(), 126u);
  EXPECT_EQ(at[0].stage, 0);
  EXPECT_EQ(at[1].stage, 1);     // virtual stage 1 runs on stage 1
  EXPECT_EQ(at[2].pos, 1);
  EXPECT_EQ(at[17].stage, 1);    // layer 17 is in virtual stage 9 -> stage 1, its second chunk
  EXPECT_EQ(at[17].vchunk, 1);
  EXPECT_EQ(at[125].stage, 7);
  EXPECT_EQ(at[125].vchunk, 7);
  EXPECT_EQ(s.stage_layers(0), 1 + 7 * 2);
}

TEST(PipelineSplit, BalancedWhenNeitherRuleSplits) {
  // DeepSeek-V3's 61 layers over 32 virtual stages: Megatron-Bridge's layout "Et|(tt|)*30mL" -> 1, 2 x 30, 0.
  const SplitResult r = split_layers(61, 8, 4);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.split.rule, SplitRule::Balanced);
  std::vector<int> want(32, 2);
  want.front() = 1;
  want.back() = 0;
  EXPECT_EQ(r.split.layers, want);
  // 61 over 16 stages: middle stages 4, the edges fewer, 61 in all.
  const SplitResult r16 = split_layers(61, 16, 1);
  ASSERT_TRUE(r16.ok);
  EXPECT_EQ(sum(r16.split), 61);
  EXPECT_EQ(r16.split.layers_in(0), 3);
  EXPECT_EQ(r16.split.layers_in(15), 2);
  for (int c = 1; c < 15; ++c) EXPECT_EQ(r16.split.layers_in(c), 4) << c;
  // Two stages and an odd count: the last stage (loss) holds one fewer.
  const SplitResult two = split_layers(61, 2, 1);
  ASSERT_TRUE(two.ok);
  EXPECT_EQ(two.split.layers, (std::vector<int>{31, 30}));
}

TEST(PipelineSplit, FirstAndLastStageLayers) {
  PipelineLayout want;
  want.first_stage_layers = 7;
  want.last_stage_layers = 6;
  const SplitResult r = split_layers(61, 8, 1, want);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.split.rule, SplitRule::FirstLast);
  EXPECT_EQ(r.split.layers, (std::vector<int>{7, 8, 8, 8, 8, 8, 8, 6}));
  // 52 left over 6 stages does not divide: one sentence naming the counts.
  want.first_stage_layers = 4;
  want.last_stage_layers = 5;
  const SplitResult bad = split_layers(61, 8, 1, want);
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.error.find("4/5 leave 52"), std::string::npos) << bad.error;
  // With vpp each stage's layers split evenly over its virtual stages (Megatron get_num_layers_to_build).
  PipelineLayout v;
  v.first_stage_layers = 6;
  v.last_stage_layers = 6;
  const SplitResult rv = split_layers(28, 4, 2, v);
  ASSERT_TRUE(rv.ok) << rv.error;
  EXPECT_EQ(rv.split.layers, (std::vector<int>{3, 4, 4, 3, 3, 4, 4, 3}));
  EXPECT_EQ(rv.split.stage_layers(0), 6);
  v.first_stage_layers = 5;
  EXPECT_NE(split_layers(31, 4, 2, v).error.find("not divisible by vpp = 2"), std::string::npos);
  PipelineLayout one;
  one.first_stage_layers = 3;
  EXPECT_NE(split_layers(8, 1, 1, one).error.find("need pp > 1"), std::string::npos);
}

TEST(PipelineSplit, ExplicitListPerVirtualStage) {
  PipelineLayout want;
  want.chunk_layers = {1, 3, 3, 1};
  const SplitResult r = split_layers(8, 2, 2, want);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.split.rule, SplitRule::Explicit);
  EXPECT_EQ(r.split.stage_layers(0), 4);  // virtual stages 0 and 2
  EXPECT_EQ(r.split.stage_layers(1), 4);
  want.chunk_layers = {1, 3, 3};
  EXPECT_NE(split_layers(8, 2, 2, want).error.find("3 entries but pp*vpp = 4"), std::string::npos);
  want.chunk_layers = {1, 3, 3, 2};
  EXPECT_NE(split_layers(8, 2, 2, want).error.find("sums to 9"), std::string::npos);
  want.first_stage_layers = 1;
  EXPECT_NE(split_layers(8, 2, 2, want).error.find("not both"), std::string::npos);
}

TEST(PipelineSplit, TooManyVirtualStagesIsOneSentence) {
  const SplitResult r = split_layers(4, 4, 2);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("exceed the 4 layers"), std::string::npos) << r.error;
}

// Every automatic split of every layer count up to 130 over pp*vpp up to 64 covers each layer exactly once, keeps
// middle virtual stages non-empty, and differs by at most one layer between middle stages.
TEST(PipelineSplit, AutomaticSplitsAreCompleteAndBalanced) {
  for (int layers = 1; layers <= 130; ++layers)
    for (int pp = 1; pp <= 16; ++pp)
      for (int vpp = 1; vpp <= 4; ++vpp) {
        if (vpp > 1 && pp == 1) continue;
        const SplitResult r = split_layers(layers, pp, vpp);
        if (pp * vpp > layers + 2) {
          EXPECT_FALSE(r.ok);
          continue;
        }
        ASSERT_TRUE(r.ok) << layers << " " << pp << " " << vpp << ": " << r.error;
        const PipelineSplit& s = r.split;
        ASSERT_EQ(sum(s), layers);
        int lo = 1 << 30, hi = 0;
        for (int c = 1; c + 1 < s.chunks(); ++c) lo = std::min(lo, s.layers_in(c)), hi = std::max(hi, s.layers_in(c));
        if (s.chunks() > 2) {
          EXPECT_GE(lo, 1) << layers << " " << pp << " " << vpp;
          EXPECT_LE(hi - lo, 1) << layers << " " << pp << " " << vpp;
        }
        for (int c = 0; c < s.chunks(); ++c) EXPECT_GE(s.layers_in(c), 0);
        EXPECT_EQ(place_layers(s).size(), size_t(layers));
      }
}

}  // namespace
}  // namespace lcplan
