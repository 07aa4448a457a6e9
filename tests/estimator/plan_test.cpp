// Plan record, size strings and the named plan rules.
#include <gtest/gtest.h>

#include "parallel/pipeline_split.h"
#include "estimator/plan.h"
#include "estimator/plan_rules.h"
#include "common/user_error.h"
#include "tests/common/toy_model.h"

using namespace lcplan;

TEST(ParseSize, AcceptsSuffixes) {
  EXPECT_EQ(parse_size("128k", "--seq"), 131072);
  EXPECT_EQ(parse_size("64K", "--seq"), 65536);
  EXPECT_EQ(parse_size("1.5M", "--seq"), 1572864);
  EXPECT_EQ(parse_size("4096", "--seq"), 4096);
  EXPECT_EQ(parse_size("1m", "--seq"), 1048576);
}

TEST(ParseSize, RejectsWithOneSentence) {
  for (const char* bad : {"", "12x", "k", "-5", "0", "0.3", "1.2.3k", "1e5", " 128k", "128kk", ".5k", "99999999999999999999"}) {
    try {
      parse_size(bad, "--seq");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--seq"), std::string::npos) << msg;
      EXPECT_NE(msg.find("valid"), std::string::npos) << msg;
    }
  }
}

TEST(PlanJson, RoundTrips) {
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = 32;
  p.seq_len = 131072;
  p.parallel = {1, 1, 1, 4, 8, 1};
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  p.implementation = "bumblebee";
  const Plan q = plan_from_json(plan_to_json(p));
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
  EXPECT_EQ(q.parallel.cp, 4);
  EXPECT_EQ(q.moe.ep_chunks, 2);
  EXPECT_EQ(data_parallel(q), 8);
}

TEST(PlanJson, UnknownKeysAndBadTypesNameTheKey) {
  const auto expect_error = [](const char* text, const char* key) {
    try {
      plan_from_json(nlohmann::json::parse(text));
      ADD_FAILURE() << "accepted " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"model":"x","gpus":8,"seq_len":4096,"tpp":2})", "tpp");
  expect_error(R"({"model":"x","parallel":{"tp":"2"}})", "tp");
  expect_error(R"({"model":"x","parallel":{"zz":1}})", "zz");
  expect_error(R"({"model":"x","recompute":"most"})", "recompute");
  expect_error(R"({"model":"x","moe":{"ep_chunks":1.5}})", "ep_chunks");
  expect_error(R"({"gpus":8})", "model");
  expect_error(R"({"model":"x","gpus":8,"dp":3})", "dp");
  expect_error(R"([1,2])", "object");
  expect_error(R"({"model":"x","seq_len":"12x"})", "seq_len");
}

TEST(PlanRules, EachRuleNamesTheValue) {
  const ModelSpec m = lcplan::testing::toy_model();
  Plan base;
  base.model = "toy";
  base.gpus = 8;
  base.seq_len = 1024;
  ASSERT_FALSE(check_plan(m, base));
  struct Case {
    void (*edit)(Plan&);
    Rule rule;
    const char* needle;
  };
  const Case cases[] = {
      {[](Plan& p) { p.parallel.tp = 3; }, Rule::TpHeads, "heads"},
      {[](Plan& p) { p.parallel.cp = 3; }, Rule::GpusDivisible, "tp*pp*cp"},
      {[](Plan& p) { p.parallel.tp = 8; }, Rule::TpHeads, "heads"},
      {[](Plan& p) { p.parallel.ep = 8; }, Rule::EpExperts, "experts"},
      {[](Plan& p) { p.parallel.pp = 8; }, Rule::LayersSplit, "layers"},
      {[](Plan& p) { p.parallel.vpp = 2; }, Rule::VppNeedsPp, "vpp"},
      {[](Plan& p) { p.seq_len = 1004; p.parallel.cp = 4; }, Rule::SeqDivisible, "2*cp*tp"},
      {[](Plan& p) { p.global_batch = 3; }, Rule::BatchDivisible, "global_batch"},
      {[](Plan& p) { p.moe.ep_chunks = 9; }, Rule::MoeChunks, "ep_chunks"},
      {[](Plan& p) { p.moe.routing_imbalance = 0.5; }, Rule::MoeRouting, "routing_imbalance"},
      {[](Plan& p) { p.recompute_layers = 1; }, Rule::RecomputeLayers, "recompute"},
      {[](Plan& p) { p.parallel.etp = 3; }, Rule::ExpertGroup, "ep*etp"},
      {[](Plan& p) { p.micro_batch = 0; }, Rule::Positive, "micro_batch"},
  };
  for (const auto& c : cases) {
    Plan p = base;
    c.edit(p);
    const auto v = check_plan(m, p);
    ASSERT_TRUE(v.has_value()) << rule_name(c.rule);
    EXPECT_EQ(v->rule, c.rule) << v->message;
    EXPECT_NE(v->message.find(c.needle), std::string::npos) << v->message;
    EXPECT_THROW(require_valid_plan(m, p), UserError);
  }
}

