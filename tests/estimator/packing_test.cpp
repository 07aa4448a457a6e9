// Variable-length batches (estimator/packing.h): one length reproduces the fixed-length estimate, packed attention
// costs the sum of squares, the packing keeps its budget and its draws, bad length files are refused.
#include <gtest/gtest.h>

#include <climits>
#include <numeric>

#include "common/data_dir.h"
#include "common/user_error.h"
#include "estimator/flops.h"
#include "estimator/packing.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"
#include "tests/common/toy_model.h"
#include "tests/common/zoo_profile.h"

using namespace lcplan;
using lcplan::testing::zoo_plan;

namespace {

struct Packing : ::testing::Test, lcplan::testing::ZooProfile {};

LengthDistribution one_length(int64_t l) { return {{l}, {1.0}}; }

// 70% at 4K and 30% at 16K: the bimodal mix of short prompts and long rollouts, scaled down.
LengthDistribution bimodal() { return {{4096, 16384}, {7.0, 3.0}}; }

}  // namespace

// The first acceptance: a distribution of one length is the plan at that length, for every zoo model, with the
// micro batch as the packing (sequences per microbatch) and as a token budget of the same size.
TEST_F(Packing, OneLengthReproducesTheFixedLengthEstimateOverTheZoo) {
  int checked = 0;
  for (const std::string& name : zoo_names(data_dir())) {
    const ModelSpec m = load_model(name, data_dir());
    Plan p = zoo_plan(name, 8, 8192);
    p.micro_batch = 2;
    p.global_batch = 32;
    p.parallel.tp = 2;
    if (check_plan(m, p)) continue;
    const Estimate fixed = estimate(m, p, hw, cal(p));
    for (int64_t budget : {int64_t(0), int64_t(2 * 8192)}) {
      PackingOptions o;
      o.tokens_per_microbatch = budget;
      o.samples = 2;
      Plan q = p;
      if (budget) q.micro_batch = 1;  // the budget sizes the microbatch
      const BatchEstimate b = estimate_batches(m, q, hw, cal(q), one_length(8192), o);
      SCOPED_TRACE(name + (budget ? " with a token budget" : " with a micro batch"));
      EXPECT_DOUBLE_EQ(b.step_mean, fixed.time.step_seconds);
      EXPECT_DOUBLE_EQ(b.peak_max_bytes, fixed.memory.peak_bytes);
      EXPECT_NEAR(b.tflops_per_gpu, fixed.time.tflops_per_gpu, 1e-9 * fixed.time.tflops_per_gpu);
      EXPECT_NEAR(b.tokens_per_second_per_gpu, fixed.time.tokens_per_second_per_gpu,
                  1e-9 * fixed.time.tokens_per_second_per_gpu);
      EXPECT_EQ(b.straggler_share, 0.0);
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// Megatron-LM counts THD attention by the sum of L_i^2 (training.py): a packed microbatch's attention core is that
// sum over the square of the sum, and its linear layers are those of the same tokens in one sequence.
TEST(PackedFlops, AttentionCostsTheSumOfSquares) {
  const ModelSpec m = lcplan::testing::toy_model();
  const std::vector<int64_t> packed = {4096, 1024, 1024, 2048};
  const double tokens = 8192, squares = 4096.0 * 4096 + 2 * 1024.0 * 1024 + 2048.0 * 2048;
  const LayerFlops one = layer_forward_flops(m, m.layers[0], tokens);
  const LayerFlops mix = layer_forward_flops(m, m.layers[0], tokens, 0, packed);
  EXPECT_DOUBLE_EQ(mix.attn_core / one.attn_core, squares / (tokens * tokens));
  EXPECT_DOUBLE_EQ(mix.proj, one.proj);
  EXPECT_DOUBLE_EQ(mix.dense_mlp, one.dense_mlp);
  EXPECT_DOUBLE_EQ(packed_context(tokens, 0, {}), causal_context(tokens, 0));
}

// The time model spends the attention cores' FLOPs at the rate of the packed sequences (their FLOP-weighted length):
// with a flat efficiency curve the attention time is exactly the sum of squares' share of the single sequence's.
TEST_F(Packing, PackedAttentionTimeScalesWithTheSumOfSquares) {
  const ModelSpec m = load_model("llama-3.1-8b", data_dir());
  Plan whole = zoo_plan("llama-3.1-8b", 8, 32768);
  whole.global_batch = 8;
  Plan packed = whole;
  packed.packed_lengths = {16384, 8192, 4096, 4096};
  ASSERT_FALSE(check_plan(m, packed)) << check_plan(m, packed)->message;
  Calibration flat = cal(whole);
  flat.attention_half_seq = 0;
  const double a_whole = estimate_time(m, whole, hw, flat).breakdown.compute_attention;
  const double a_packed = estimate_time(m, packed, hw, flat).breakdown.compute_attention;
  const double squares = 16384.0 * 16384 + 8192.0 * 8192 + 2 * 4096.0 * 4096;
  EXPECT_NEAR(a_packed / a_whole, squares / (32768.0 * 32768), 1e-9);
  // With the profile's curve the shorter sequences run attention less efficiently: more than the FLOP share.
  const double c_whole = estimate_time(m, whole, hw, cal(whole)).breakdown.compute_attention;
  const double c_packed = estimate_time(m, packed, hw, cal(packed)).breakdown.compute_attention;
  EXPECT_GT(c_packed / c_whole, squares / (32768.0 * 32768));
}

// A micro batch of equal sequences and the same sequences packed are the same attention work at the same rate:
// flash attention's efficiency follows each sequence's length (its half point is per sequence), not the batch's tokens.
TEST_F(Packing, AMicroBatchOfEqualSequencesIsItsPackedForm) {
  const ModelSpec m = load_model("llama-3.1-8b", data_dir());
  Plan batch = zoo_plan("llama-3.1-8b", 8, 2048);
  batch.micro_batch = 4;
  batch.global_batch = 32;
  Plan packed = batch;
  packed.micro_batch = 1;
  packed.seq_len = 4 * 2048;
  packed.global_batch = 8;  // the same 32 sequences, four per packed microbatch
  packed.packed_lengths = {2048, 2048, 2048, 2048};
  ASSERT_FALSE(check_plan(m, packed)) << check_plan(m, packed)->message;
  const double a_batch = estimate_time(m, batch, hw, cal(batch)).breakdown.compute_attention;
  const double a_packed = estimate_time(m, packed, hw, cal(packed)).breakdown.compute_attention;
  EXPECT_NEAR(a_packed / a_batch, 1.0, 1e-12);
  // One sequence of the same tokens runs at a higher rate on four times the work: the test can tell them apart.
  Plan whole = packed;
  whole.packed_lengths.clear();
  const double a_whole = estimate_time(m, whole, hw, cal(whole)).breakdown.compute_attention;
  EXPECT_LT(a_whole / a_batch, 4.0 * 0.99);
}

// Every drawn sequence lands in exactly one microbatch, no microbatch exceeds its budget, the DP ranks' tokens differ
// by at most one sequence, and the same seed draws the same steps.
// 64 sequences on 16 GPUs at CP 2 (8 DP ranks), four drawn steps with seed 7, packed by `budget` tokens per GPU.
Plan cp2_plan() {
  Plan p = zoo_plan("qwen3-30b-a3b", 16, 16384);
  p.parallel.cp = 2;
  p.global_batch = 64;
  return p;
}
PackingOptions four_steps(int64_t budget) {
  PackingOptions o;
  o.tokens_per_microbatch = budget;
  o.samples = 4;
  o.seed = 7;
  return o;
}

TEST(PackingDraws, FirstFitDecreasingKeepsTheBudgetAndTheDraws) {
  Plan p = cp2_plan();
  PackingOptions o = four_steps(16384);  // 32768 tokens per microbatch over cp 2
  const LengthDistribution d = {{1000, 3000, 9000, 30000}, {4, 3, 2, 1}};
  const auto steps = draw_steps(d, p, o);
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& step : steps) {
    ASSERT_EQ(int(step.size()), data_parallel(p));
    int sequences = 0;
    std::vector<int64_t> load;
    for (const auto& rank : step) {
      int64_t tokens = 0;
      for (const auto& mb : rank) {
        EXPECT_LE(mb.tokens, 32768);
        EXPECT_EQ(mb.tokens, std::accumulate(mb.lengths.begin(), mb.lengths.end(), int64_t(0)));
        for (int64_t l : mb.lengths) EXPECT_EQ(l % sequence_multiple(p), 0);  // padded to 2*cp*tp
        sequences += int(mb.lengths.size());
        tokens += mb.tokens;
      }
      load.push_back(tokens);
    }
    EXPECT_EQ(sequences, 64);
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 30000 + 4);
  }
  const auto again = draw_steps(d, p, o);
  EXPECT_EQ(again[3][1][0].lengths, steps[3][1][0].lengths);
  o.seed = 8;
  const auto other = draw_steps(d, p, o);
  bool differs = false;
  for (size_t s = 0; s < steps.size(); ++s)
    for (size_t r = 0; r < steps[s].size(); ++r) differs |= other[s][r].size() != steps[s][r].size() ||
                                                            other[s][r][0].lengths != steps[s][r][0].lengths;
  EXPECT_TRUE(differs);
}

// RL trainers' dynamic batch size (verl rearrange_micro_batches): every DP rank runs the count the fullest rank needs,
// a multiple of pp under the interleaved schedule, its tokens balanced over them; the same draws as first fit.
TEST(PackingDraws, BalancedGivesEveryRankTheSameCount) {
  Plan p = cp2_plan();
  PackingOptions o = four_steps(8192);  // 16384 tokens per microbatch over cp 2
  o.policy = PackingPolicy::Balanced;
  const LengthDistribution d = {{1000, 3000, 9000, 15000}, {4, 3, 2, 1}};
  const auto balanced = draw_steps(d, p, o);
  o.policy = PackingPolicy::FirstFit;
  const auto first_fit = draw_steps(d, p, o);
  bool counts_differ_under_first_fit = false;
  for (size_t s = 0; s < balanced.size(); ++s) {
    size_t most = 0;
    int64_t heaviest = 0;
    for (size_t r = 0; r < balanced[s].size(); ++r) {
      int64_t tokens = 0, ff_tokens = 0;
      for (const auto& mb : balanced[s][r]) tokens += mb.tokens;
      for (const auto& mb : first_fit[s][r]) ff_tokens += mb.tokens;
      EXPECT_EQ(tokens, ff_tokens) << "the same sequences on the same rank";
      heaviest = std::max(heaviest, tokens);
      most = std::max(most, first_fit[s][r].size());
      counts_differ_under_first_fit |= first_fit[s][r].size() != first_fit[s][0].size();
    }
    const size_t count = size_t((heaviest + 16383) / 16384);
    for (const auto& rank : balanced[s]) {
      EXPECT_EQ(rank.size(), count);
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& mb : rank) lo = std::min(lo, mb.tokens), hi = std::max(hi, mb.tokens);
      EXPECT_LE(hi - lo, 15000 + 4) << "balanced within the longest sequence";
    }
    EXPECT_LE(count, most);
  }
  EXPECT_TRUE(counts_differ_under_first_fit) << "the case must tell the policies apart";
  // Interleaved pipelines run a multiple of pp microbatches (a rank with fewer sequences runs one each).
  p.gpus = 64;
  p.parallel.pp = 4;
  p.parallel.vpp = 2;
  o.policy = PackingPolicy::Balanced;
  for (const auto& step : draw_steps(d, p, o)) {
    size_t count = 0;
    for (const auto& rank : step) count = std::max(count, rank.size());
    EXPECT_EQ(count % 4, 0u);
    for (const auto& rank : step) {
      size_t sequences = 0;
      for (const auto& mb : rank) sequences += mb.lengths.size();
      EXPECT_EQ(rank.size(), std::min(count, sequences));
    }
  }
}

// Qwen3-30B-A3B on 16 GPUs at `seq` with CP and EP, 64 sequences per step; drawn steps packed by 8K per GPU.
Plan qwen_moe_plan(int64_t seq, int cp, int ep) {
  Plan p = zoo_plan("qwen3-30b-a3b", 16, seq);
  p.parallel.cp = cp;
  p.parallel.ep = ep;
  p.global_batch = 64;
  return p;
}
PackingOptions budget_8k(int samples) {
  PackingOptions o;
  o.tokens_per_microbatch = 8192;
  o.samples = samples;
  return o;
}

// Memory is read at the fullest microbatch and the step at the slowest rank: a bimodal mix puts the peak at the
// long sequences' microbatch and leaves a straggler; the record's worst estimate is that microbatch's plan.
TEST_F(Packing, BimodalBatchesPeakAtTheFullestMicrobatchAndWaitForTheStraggler) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  const Plan p = qwen_moe_plan(16384, 2, 8);
  const PackingOptions o = budget_8k(8);
  const BatchEstimate b = estimate_batches(m, p, hw, cal(p), bimodal(), o);
  EXPECT_GE(b.peak_max_bytes, b.peak_p99_bytes);
  EXPECT_EQ(b.tokens_max, 16384);
  EXPECT_DOUBLE_EQ(b.worst_estimate.memory.peak_bytes, estimate(m, b.worst_plan, hw, cal(p)).memory.peak_bytes);
  EXPECT_DOUBLE_EQ(b.worst_estimate.memory.peak_bytes, b.peak_max_bytes);
  EXPECT_GT(b.straggler_share, 0.0);
  EXPECT_LT(b.straggler_share, 0.5);
  EXPECT_GE(b.step_mean, b.rank_mean);
  EXPECT_LE(b.step_p10, b.step_mean);
  EXPECT_GE(b.step_p90, b.step_mean * 0.999);
  // Fewer attention FLOPs than the same tokens as 16K sequences: packed to the fixed-length plan's 16K tokens per
  // microbatch (the same per-microbatch costs: launches, all-to-all calls), faster per token than that plan.
  Plan fixed = p;
  fixed.seq_len = 16384;
  fixed.micro_batch = 1;
  PackingOptions same = o;
  same.tokens_per_microbatch = 16384;
  const BatchEstimate b16 = estimate_batches(m, p, hw, cal(p), bimodal(), same);
  EXPECT_GT(b16.tokens_per_second_per_gpu, estimate(m, fixed, hw, cal(p)).time.tokens_per_second_per_gpu);
}

TEST(SeqLengthFiles, ReadLinesListsAndHistograms) {
  const LengthDistribution lines = parse_seq_lengths("4096\n# a comment\n\n8192  \n4096\n", "f");
  EXPECT_EQ(lines.lengths, (std::vector<int64_t>{4096, 8192}));
  EXPECT_EQ(lines.weights, (std::vector<double>{2, 1}));
  const LengthDistribution list = parse_seq_lengths("[8192, 4096, 4096]", "f");
  EXPECT_EQ(list.lengths, lines.lengths);
  EXPECT_EQ(list.weights, lines.weights);
  const LengthDistribution hist = parse_seq_lengths("[[4096, 2], [8192, 1], [100, 0]]", "f");
  EXPECT_EQ(hist.lengths, lines.lengths);
  EXPECT_DOUBLE_EQ(hist.mean_length(), (2 * 4096 + 8192) / 3.0);
}

TEST(SeqLengthFiles, BadInputIsOneSentence) {
  for (const char* text : {"", "  \n", "0\n", "-5\n", "1.5\n", "4k\n", "99999999999999\n", "[]", "[0]", "[1.5]",
                           "[[4096]]", "[[4096, -1]]", "[[4096, 0]]", "{\"a\": 1}", "[4096", "[[4096, \"x\"]]",
                           "[[100, 0.5], [200, 1e308]]", "[[200, 9e14], [200, 9e14]]"}) {
    try {
      parse_seq_lengths(text, "lengths.txt");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("lengths.txt"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

// A budget below the longest sequence (cp 1 cannot split it) is refused before anything is estimated.
TEST(PackingDraws, ABudgetBelowTheLongestSequenceIsRefused) {
  Plan p = zoo_plan("qwen3-30b-a3b", 8, 16384);
  PackingOptions o;
  o.tokens_per_microbatch = 8192;
  EXPECT_THROW(draw_steps(bimodal(), p, o), UserError);
  p.global_batch = 4;  // fewer sequences than DP ranks
  o.tokens_per_microbatch = 16384;
  EXPECT_THROW(draw_steps(bimodal(), p, o), UserError);
}

// A recipe carries its batches: written and read back, the same lengths and packing; a bad "batches" object is one
// sentence naming the field.
TEST(SeqLengthFiles, RecipesCarryTheirBatches) {
  Plan p = zoo_plan("qwen3-30b-a3b", 8, 16384);
  PackingOptions o;
  o.tokens_per_microbatch = 16384;
  o.global_tokens = 1 << 20;
  o.samples = 3;
  o.seed = 9;
  p.batches = std::make_shared<const BatchSpec>(BatchSpec{bimodal(), o});
  const Plan q = plan_from_json(plan_to_json(p));
  ASSERT_TRUE(q.batches);
  EXPECT_EQ(q.batches->lengths.lengths, p.batches->lengths.lengths);
  EXPECT_EQ(q.batches->lengths.weights, p.batches->lengths.weights);
  EXPECT_EQ(q.batches->packing.tokens_per_microbatch, 16384);
  EXPECT_EQ(q.batches->packing.global_tokens, 1 << 20);
  EXPECT_EQ(q.batches->packing.samples, 3);
  EXPECT_EQ(q.batches->packing.seed, 9u);
  EXPECT_EQ(q.batches->packing.policy, PackingPolicy::FirstFit);
  o.policy = PackingPolicy::Balanced;
  p.batches = std::make_shared<const BatchSpec>(BatchSpec{bimodal(), o});
  EXPECT_EQ(plan_from_json(plan_to_json(p)).batches->packing.policy, PackingPolicy::Balanced);
  EXPECT_FALSE(microbatch_plan(q, {{16384}, 16384}, 1).batches);  // a microbatch's plan has none
  nlohmann::json j = plan_to_json(p);
  for (const nlohmann::json& bad : {nlohmann::json(1), nlohmann::json::object(),
                                    nlohmann::json({{"seq_lengths", {4096}}, {"samples", 0}}),
                                    nlohmann::json({{"seq_lengths", {4096}}, {"budget", 1}}),
                                    nlohmann::json({{"seq_lengths", {4096}}, {"packing", "greedy"}}),
                                    nlohmann::json({{"seq_lengths", {-1}}})}) {
    j["batches"] = bad;
    try {
      plan_from_json(j);
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("batches"), std::string::npos) << e.what();
    }
  }
}

// Hybrid CP (Megatron-LM --hybrid-context-parallel): a 32K sequence over a 4-rank CP group at 8K per GPU is split
// over all four ranks, 4K ones run whole, two per rank; the busiest rank's view counts each whole sequence cp times.
TEST(HybridCp, TheBusiestRankSplitsOnlyWhatItsLengthNeeds) {
  PackedMicrobatch mb;
  mb.lengths = {32768, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096};
  mb.tokens = 65536;
  const PackedMicrobatch r = hybrid_cp_busiest_rank(mb, 4, 8192);
  ASSERT_EQ(r.lengths.size(), r.splits.size());
  double rank_tokens = 0, whole = 0;
  for (size_t i = 0; i < r.lengths.size(); ++i) {
    rank_tokens += double(r.lengths[i]) * r.splits[i] / 4 / r.splits[i];  // each entry is g / cp of L / g
    if (r.splits[i] == 1) whole += 1;
  }
  EXPECT_EQ(r.lengths.front(), 32768);
  EXPECT_EQ(r.splits.front(), 4);
  EXPECT_EQ(whole, 8);  // two whole 4K sequences, each standing cp = 4 times
  EXPECT_DOUBLE_EQ(rank_tokens, 16384);
  EXPECT_EQ(r.tokens, 4 * 16384);  // the busiest rank's tokens times cp, as a regular CP microbatch carries them
  // A 16K sequence needs 2 ranks at 8K: a group of two, the other two ranks take the rest.
  PackedMicrobatch two;
  two.lengths = {16384, 8192, 8192};
  two.tokens = 32768;
  const PackedMicrobatch t = hybrid_cp_busiest_rank(two, 4, 8192);
  EXPECT_EQ(t.splits.front(), 2);
}

// Under hybrid CP short sequences run whole (longer attention chunks, no K/V exchange): a microbatch whose short
// sequences balance over the CP ranks is faster than under regular CP, with the same model FLOPs; over drawn batches
// the rank imbalance within a CP group is charged too (no claim on the sign there); with one length that fills every
// rank it is regular CP exactly.
TEST_F(Packing, HybridCpSpeedsShortSequencesAndLeavesFullOnesAlone) {
  const ModelSpec m = load_model("qwen3-30b-a3b", data_dir());
  Plan p = qwen_moe_plan(32768, 4, 4);
  const PackingOptions o = budget_8k(4);
  const LengthDistribution mix = {{2048, 4096, 32768}, {6.0, 3.0, 1.0}};
  p.batches = std::make_shared<const BatchSpec>(BatchSpec{mix, o});
  Plan h = p;
  h.hybrid_cp = true;
  PackedMicrobatch even;  // 4 x 4K + 8 x 2K: 8K on each of the 4 ranks
  even.lengths = {4096, 4096, 4096, 4096, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048};
  even.tokens = 32768;
  const Estimate er = estimate(m, microbatch_plan(p, even, 4), hw, cal(p)), eh = estimate(m, microbatch_plan(h, even, 4), hw, cal(p));
  EXPECT_LT(eh.time.breakdown.compute_attention, er.time.breakdown.compute_attention);
  // The GPU's work shrinks; the step shrinks with it unless the host's kernel launches bound the layer (then the
  // launch floor takes up what attention saved, as it does for this 8K-per-rank MoE layer under the default profile).
  const auto gpu = [](const Estimate& e) { return e.time.step_seconds - e.time.breakdown.launch_overhead; };
  EXPECT_LT(gpu(eh), gpu(er));
  EXPECT_LE(eh.time.step_seconds, er.time.step_seconds * (1 + 1e-12));
  const BatchEstimate regular = estimate_batches(m, p, hw, cal(p), mix, o);
  const BatchEstimate hybrid = estimate_batches(m, h, hw, cal(p), mix, o);
  EXPECT_NEAR(hybrid.tflops_per_gpu / regular.tflops_per_gpu,
              hybrid.tokens_per_second_per_gpu / regular.tokens_per_second_per_gpu, 1e-9);  // the same model FLOPs
  const LengthDistribution full = {{32768}, {1.0}};
  h.batches = p.batches = std::make_shared<const BatchSpec>(BatchSpec{full, o});
  EXPECT_DOUBLE_EQ(estimate_batches(m, h, hw, cal(p), full, o).step_mean, estimate_batches(m, p, hw, cal(p), full, o).step_mean);
  // The microbatch plan carries the splits, and the rules hold it to powers of two dividing cp.
  h.batches = std::make_shared<const BatchSpec>(BatchSpec{mix, o});
  PackedMicrobatch mb;
  mb.lengths = {32768, 2048, 2048, 2048, 2048};
  mb.tokens = 40960;
  Plan q = microbatch_plan(h, mb, 1);
  ASSERT_EQ(q.packed_splits.size(), q.packed_lengths.size());
  EXPECT_FALSE(check_plan(m, q).has_value());
  q.packed_splits.back() = 3;
  ASSERT_TRUE(check_plan(m, q).has_value());
  EXPECT_NE(check_plan(m, q)->message.find("power of two"), std::string::npos);
}
