// Routing, its backward and the permutation index math on hand-made cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/moe/moe_math.h"

namespace lcplan::moe {
namespace {

TEST(Routing, SoftmaxTopKPicksLargestWithLowerIndexOnTies) {
  RouterParams p;
  p.experts = 5;
  p.top_k = 2;
  p.normalize = false;
  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};  // experts 1 and 3 tie
  float scores[5], w[2];
  int idx[2];
  route_token(p, logits, static_cast<const float*>(nullptr), scores, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  float z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(w[0], std::exp(2.0f) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.0f) / z, 1e-6);
  p.normalize = true;  // Qwen3 norm_topk_prob / Mixtral: softmax over the chosen k
  route_token(p, logits, static_cast<const float*>(nullptr), scores, idx, w);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
}

TEST(Routing, GroupLimitedKeepsBestGroupsByTopTwoSum) {
  // 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
  RouterParams p;
  p.kind = Router::SigmoidGroupLimited;
  p.experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.scale = 2.5f;
  // Scores (sigmoid of logits): group 0 = {0.9, 0.1} (sum 1.0), group 1 = {0.6, 0.6} (1.2),
  // group 2 = {0.55, 0.5} (1.05), group 3 = {0.2, 0.3} (0.5). Best single expert (0.9) is in group 0.
  const double s[8] = {0.9, 0.1, 0.6, 0.6, 0.55, 0.5, 0.2, 0.3};
  double logits[8], scores[8], w[2];
  for (int e = 0; e < 8; ++e) logits[e] = std::log(s[e] / (1 - s[e]));
  int idx[2];
  route_token(p, logits, static_cast<const double*>(nullptr), scores, idx, w);
  // Groups 1 (1.2) and 2 (1.05) win; group 0 (1.0) is dropped although it holds the best expert.
  EXPECT_EQ(idx[0], 2);
  EXPECT_EQ(idx[1], 3);
  EXPECT_NEAR(w[0], 2.5 * 0.5, 1e-12);
  EXPECT_NEAR(w[1], 2.5 * 0.5, 1e-12);
  // An expert bias steers selection (group 3 gets +1 each: 2.5 > others) but not the weights.
  const double bias[8] = {0, 0, 0, 0, 0, 0, 1.0, 1.0};
  route_token(p, logits, bias, scores, idx, w);
  EXPECT_EQ(idx[0], 7);  // 0.3 + 1
  EXPECT_EQ(idx[1], 6);  // 0.2 + 1
  EXPECT_NEAR(w[0], 2.5 * 0.3 / 0.5, 1e-12);
  EXPECT_NEAR(w[1], 2.5 * 0.2 / 0.5, 1e-12);
}

TEST(Routing, BackwardMatchesFiniteDifferences) {
  for (Router kind : {Router::SoftmaxTopK, Router::SigmoidGroupLimited})
    for (bool norm : {false, true}) {
      RouterParams p;
      p.kind = kind;
      p.experts = 6;
      p.top_k = 3;
      p.n_group = kind == Router::SoftmaxTopK ? 1 : 3;
      p.topk_group = kind == Router::SoftmaxTopK ? 1 : 2;
      p.normalize = norm;
      p.scale = 1.5f;
      const double logits[6] = {0.3, -1.2, 0.8, 1.9, -0.4, 0.05};
      const double dw[3] = {0.7, -0.2, 1.1};
      double scores[6], w[3], dl[6];
      int idx[3];
      route_token(p, logits, static_cast<const double*>(nullptr), scores, idx, w);
      route_token_bwd(p, scores, idx, dw, dl);
      for (int e = 0; e < 6; ++e) {
        double lp[6], lm[6], sp[6], sm[6], wp[3], wm[3];
        int ip[3], im[3];
        std::copy(logits, logits + 6, lp);
        std::copy(logits, logits + 6, lm);
        lp[e] += 1e-6;
        lm[e] -= 1e-6;
        route_token(p, lp, static_cast<const double*>(nullptr), sp, ip, wp);
        route_token(p, lm, static_cast<const double*>(nullptr), sm, im, wm);
        double fd = 0;
        for (int k = 0; k < 3; ++k) fd += dw[k] * (wp[k] - wm[k]) / 2e-6;
        EXPECT_NEAR(dl[e], fd, 1e-7) << "expert " << e << " norm " << norm;
      }
    }
}

TEST(Permutation, StableExpertMajorRows) {
  // 4 tokens x top-2 = 8 slots over 4 experts; expert 2 receives nothing.
  const int expert_of_slot[8] = {3, 0, 1, 0, 3, 1, 0, 3};
  int offsets[5], row[8];
  expert_major_rows(expert_of_slot, 8, 4, offsets, row);
  EXPECT_EQ(std::vector<int>(offsets, offsets + 5), (std::vector<int>{0, 3, 5, 5, 8}));
  // expert 0: slots 1,3,6 -> rows 0,1,2; expert 1: slots 2,5 -> 3,4; expert 3: slots 0,4,7 -> 5,6,7
  EXPECT_EQ(std::vector<int>(row, row + 8), (std::vector<int>{5, 0, 3, 1, 6, 4, 2, 7}));
}

TEST(Permutation, TiledParallelFormEqualsSequential) {
  // The GPU's count -> scan -> scatter phases, run here tile by tile in reverse order (as unordered workers may),
  // must give exactly the sequential stable rows, for tile sizes that split experts across tiles.
  for (int n : {0, 1, 7, 64, 203})
    for (int tile : {1, 3, 16, 64, 256}) {
      const int E = 6;
      std::vector<int> expert(n);
      for (int i = 0; i < n; ++i) expert[i] = (i * 7 + i / 5) % E == 2 ? 4 : (i * 7 + i / 5) % E;  // expert 2 empty
      std::vector<int> off_seq(E + 1), row_seq(n), off_par(E + 1), row_par(n, -1);
      expert_major_rows(expert.data(), n, E, off_seq.data(), row_seq.data());
      const int tiles = tiles_of(n, tile);
      std::vector<int> counts(size_t(E) * tiles), base(counts.size());
      for (int ti = tiles - 1; ti >= 0; --ti) tile_expert_counts(expert.data(), n, E, tile, ti, counts.data());
      int run = 0;
      for (size_t i = 0; i < counts.size(); ++i) base[i] = run, run += counts[i];
      for (int e = 0; e <= E; ++e) off_par[e] = expert_offset_from_bases(base.data(), n, E, tile, e);
      for (int ti = tiles - 1; ti >= 0; --ti) tile_scatter_rows(expert.data(), n, tile, ti, base.data(), row_par.data());
      EXPECT_EQ(off_par, off_seq) << "n " << n << " tile " << tile;
      EXPECT_EQ(row_par, row_seq) << "n " << n << " tile " << tile;
      if (n > 0) {
        EXPECT_EQ(off_seq[3] - off_seq[2], 0);
      }
    }
}

TEST(Permutation, BlockOffsetsSourceAndExpertMajor) {
  // 2 sources x 3 local experts; counts[s*3+e]
  const int64_t counts[6] = {2, 0, 1, 3, 4, 0};
  EXPECT_EQ(block_offset_src_major(counts, 2, 3, 0, 2), 2);
  EXPECT_EQ(block_offset_src_major(counts, 2, 3, 1, 1), 6);
  EXPECT_EQ(block_offset_expert_major(counts, 2, 3, 1, 0), 2);  // after source 0's 2 rows of expert 0
  EXPECT_EQ(block_offset_expert_major(counts, 2, 3, 0, 1), 5);  // after expert 0's 5 rows
  EXPECT_EQ(block_offset_expert_major(counts, 2, 3, 0, 2), 9);  // after expert 1's 4 rows
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  for (double g : {-2.0, -0.3, 0.0, 0.7, 3.1})
    for (double u : {-1.0, 0.5}) {
      double dg, du;
      swiglu_bwd(g, u, 1.0, &dg, &du);
      EXPECT_NEAR(dg, (swiglu(g + 1e-6, u) - swiglu(g - 1e-6, u)) / 2e-6, 1e-8);
      EXPECT_NEAR(du, (swiglu(g, u + 1e-6) - swiglu(g, u - 1e-6)) / 2e-6, 1e-8);
    }
}

}  // namespace
}  // namespace lcplan::moe
