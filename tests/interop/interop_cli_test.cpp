// The CLI end to end: `estimate --megatron-args` / `--megatron-args-file` give the same record as `estimate --plan`
// of the same plan; lcplan flags override the launch; `search --emit megatron` prints flags that read back as its
// recipe; `ingest megatron` writes records `calibrate` accepts (and skips out-of-memory ones).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "models/zoo.h"
#include "tests/common/cli_runner.h"
#include "search/megatron_args.h"

namespace fs = std::filesystem;

namespace lcplan {
namespace {

using lcplan::testing::Outcome;
using lcplan::testing::slurp;
using lcplan::testing::write_scratch;

const fs::path& scratch() { return lcplan::testing::scratch("lcplan_interop_cli_test"); }
fs::path write(const std::string& name, const std::string& text) { return write_scratch(name, text); }

Outcome run_lcplan(std::vector<std::string> args) {
  args.insert(args.begin(), LCPLAN_BINARY);
  return lcplan::testing::run_program(args);
}

// The article's reduced recipe for Qwen3.5-35B-A3B on 32 H100s at 128K, as a Megatron launch and as a recipe.
const std::string kLaunch =
    "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
    "--context-parallel-size 4 --cp-comm-type p2p --expert-model-parallel-size 8 --seq-length 131072 --micro-batch-size 1 "
    "--global-batch-size 8 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
    "--use-distributed-optimizer --no-gradient-accumulation-fusion --recompute-granularity full --recompute-method uniform "
    "--recompute-num-layers 1 --cross-entropy-loss-fusion --cross-entropy-fusion-impl linear "
    "--moe-token-dispatcher-type alltoall --moe-grouped-gemm --mtp-num-layers 1 --bf16 --lr 1e-4 --frobnicate 3 --data-path /data/x";
const char* kRecipe = R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": 131072, "micro_batch": 1, "global_batch": 8,
  "parallel": {"tp": 1, "pp": 1, "vpp": 1, "cp": 4, "ep": 8, "etp": 1}, "optimizer_sharding": "fsdp",
  "recompute": "full", "linear_ce": true})";

TEST(InteropCli, EstimateMegatronArgsEqualsEstimatePlan) {
  const Outcome a = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--megatron-args", kLaunch, "--json"});
  ASSERT_EQ(a.status, 0) << a.err;
  const Outcome b = run_lcplan({"estimate", "--plan", write("recipe.json", kRecipe).string(), "--json"});
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  // One warning line lists the flag lcplan does not know; known flags without effect (--lr, --data-path) are silent.
  EXPECT_EQ(a.err, "lcplan: warning: ignored Megatron flags lcplan does not know: --frobnicate\n");
  EXPECT_TRUE(b.err.empty());
}

TEST(InteropCli, EstimateMegatronScriptEqualsEstimatePlan) {
  const fs::path script = write("run.sh",
                                "#!/bin/bash\nNODES=4\nWORLD_SIZE=$((NODES * 8))\nARGS=(\n  " + kLaunch.substr(kLaunch.find("--tensor")) +
                                    "\n)\ntorchrun --nnodes $NODES --nproc-per-node 8 pretrain_gpt.py \"${ARGS[@]}\" 2>&1 | tee log\n");
  const Outcome a = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--megatron-args-file", script.string(), "--json"});
  ASSERT_EQ(a.status, 0) << a.err;
  const Outcome b = run_lcplan({"estimate", "--plan", write("recipe.json", kRecipe).string(), "--json"});
  EXPECT_EQ(a.out, b.out);
}

TEST(InteropCli, LcplanFlagsOverrideTheLaunch) {
  // Chunked EP is bumblebee's (and lcplan-exec's): the implementation flag overrides the launch's too.
  const Outcome a = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--megatron-args", kLaunch, "--cp", "8",
                                "--no-linear-ce", "--ep-chunks", "2", "--implementation", "bumblebee", "--json"});
  ASSERT_EQ(a.status, 0) << a.err;
  const auto plan = nlohmann::json::parse(a.out).at("plan");
  EXPECT_EQ(plan.at("parallel").at("cp"), 8);
  EXPECT_EQ(plan.at("linear_ce"), false);
  EXPECT_EQ(plan.at("moe").at("ep_chunks"), 2);
  EXPECT_EQ(plan.at("global_batch"), 8);  // kept from the launch
}

TEST(InteropCli, ModelFromShapeFlags) {
  // Llama-3.1-8B's shape as Megatron flags gives the same estimate as the zoo model (the plan's model name aside).
  const ModelSpec m = load_model("llama-3.1-8b", LCPLAN_SOURCE_DIR);
  const std::string args = megatron_model_flags(m) + " --tensor-model-parallel-size 2 --sequence-parallel --seq-length 8192 "
                                                     "--use-distributed-optimizer --bf16";
  const Outcome a = run_lcplan({"estimate", "--megatron-args", args, "--gpus", "8", "--json"});
  ASSERT_EQ(a.status, 0) << a.err;
  const Outcome b = run_lcplan({"estimate", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8192", "--tp", "2",
                                "--global-batch", "4", "--json"});
  ASSERT_EQ(b.status, 0) << b.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja.at("plan").at("model"), "megatron-flags");
  EXPECT_EQ(ja.at("memory"), jb.at("memory"));
  EXPECT_EQ(ja.at("time"), jb.at("time"));
}

TEST(InteropCli, SearchEmitsFlagsThatReadBackAsItsRecipe) {
  const fs::path recipe = scratch() / "best.json";
  const Outcome s = run_lcplan({"search", "--model", "qwen3-30b-a3b", "--gpus", "64", "--seq", "32k", "--emit", "megatron",
                                "--out", recipe.string(), "--top", "1"});
  ASSERT_EQ(s.status, 0) << s.err;
  const std::string flags = s.out.substr(s.out.find("--num-layers"));
  const MegatronLaunch l = parse_megatron_args(flags);
  EXPECT_TRUE(l.ignored.empty()) << l.ignored.front();
  ASSERT_TRUE(l.model);
  const Plan want = plan_from_json(nlohmann::json::parse(slurp(recipe)));
  const Plan back = finish_megatron_plan(l, *l.model, want.gpus);
  EXPECT_EQ(megatron_plan_difference(want, back), "") << flags;
  // And the search takes a launch as its fixed fields: same model, GPUs, sequence and batch.
  const Outcome s2 = run_lcplan({"search", "--megatron-args", flags, "--gpus", "64", "--top", "1", "--json"});
  ASSERT_EQ(s2.status, 0) << s2.err;
  const auto top = nlohmann::json::parse(s2.out).at("top").at(0).at("plan");
  EXPECT_EQ(top.at("seq_len"), 32768);
  EXPECT_EQ(top.at("global_batch"), want.global_batch);
}

TEST(InteropCli, IngestWritesRecordsCalibrateReads) {
  const std::string logs = LCPLAN_INTEROP_LOGS;
  const fs::path runs = scratch() / "runs.json";
  const Outcome i = run_lcplan({"ingest", "megatron", logs + "/qwen3-30b-ep8.log", logs + "/oom-before-first-iteration.log",
                                "--plan", logs + "/qwen3-30b-ep8.recipe.json", "--id", "h100", "--out", runs.string()});
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_TRUE(i.err.empty()) << i.err;
  EXPECT_NE(i.out.find("h100-qwen3-30b-ep8: step 1.210 s, 301.4 TFLOP/s/GPU, peak 61.52 GiB (rank 2)"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("h100-oom-before-first-iteration: out of memory, the plan did not fit"), std::string::npos) << i.out;
  const auto records = nlohmann::json::parse(slurp(runs));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].at("status"), "out_of_memory");

  const Outcome c = run_lcplan({"calibrate", "--measurements", runs.string(), "--out", (scratch() / "calib.json").string(),
                                "--fit", "memory.fragmentation", "--no-loo"});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.out.find("skipped 1 measurements with status out_of_memory"), std::string::npos) << c.out;

  // --append keeps what is there and refuses a second record with the same id.
  const Outcome again = run_lcplan({"ingest", "megatron", logs + "/qwen3-30b-ep8.log", "--plan", logs + "/qwen3-30b-ep8.recipe.json",
                                    "--id", "second", "--out", runs.string(), "--append", "--skip-iterations", "2"});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(runs)).size(), 3u);
  const Outcome dup = run_lcplan({"ingest", "megatron", logs + "/qwen3-30b-ep8.log", "--plan", logs + "/qwen3-30b-ep8.recipe.json",
                                  "--id", "second", "--out", runs.string(), "--append"});
  EXPECT_EQ(dup.status, 2);
  EXPECT_NE(dup.err.find("record id \"second\" is given twice"), std::string::npos) << dup.err;
  EXPECT_TRUE(dup.out.empty());
  EXPECT_EQ(nlohmann::json::parse(slurp(runs)).size(), 3u);  // untouched
}

}  // namespace
}  // namespace lcplan
