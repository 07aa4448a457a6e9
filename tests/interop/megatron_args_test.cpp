// Megatron-LM command lines in and out: shell words and scripts, every flag lcplan reads, Megatron's
// contradictions (one sentence naming both flags), unknown flags listed once, the model from shape flags, and the
// round trip megatron_flags(plan) -> parse -> the same plan over the fields Megatron expresses
// (megatron_plan_difference: seq_len, micro_batch, global batch, precision, tp/pp/vpp/cp/ep/etp, the pipeline
// request, sequence_parallel when tp > 1, optimizer_sharding, recompute and its layers, offload, linear_ce,
// capacity_factor; not model, hardware, gpus, gpus_per_node, implementation, routing_imbalance, ep_chunks).
#include <gtest/gtest.h>

#include <functional>

#include "common/user_error.h"
#include "estimator/plan_rules.h"
#include "models/params.h"
#include "models/zoo.h"
#include "search/emit.h"
#include "search/megatron_args.h"
#include "search/shell_words.h"
#include "tests/common/toy_model.h"

namespace lcplan {
namespace {

using lcplan::testing::zoo_plan;

const ModelSpec& zoo(const std::string& name) {
  static std::map<std::string, ModelSpec> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_model(name, LCPLAN_SOURCE_DIR)).first;
  return it->second;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The plan of `args` for `model` on `gpus` GPUs.
Plan plan_of(const std::string& args, const std::string& model = "qwen3-30b-a3b", int gpus = 64) {
  return finish_megatron_plan(parse_megatron_args(args), zoo(model), gpus);
}

// ---------------------------------------------------------------------------------------------------------------
// Shell words and scripts

TEST(ShellWords, QuotesEscapesContinuationsAndComments) {
  const auto c = shell_words("torchrun a\\\n  'b c' \"d $X e\" f\\ g --k=v # comment 'unclosed\n h", {{"X", {{"x"}, false}}});
  EXPECT_EQ(c.words, (std::vector<std::string>{"torchrun", "a", "b c", "d x e", "f g", "--k=v", "h"}));
}

TEST(ShellWords, VariablesArraysDefaultsAndArithmetic) {
  ShellVars v = {{"A", {{"--x 1"}, false}}, {"ARR", {{"--p", "q r"}, true}}, {"N", {{"4"}, false}}, {"E", {{""}, false}}};
  EXPECT_EQ(shell_words("$A", v).words, (std::vector<std::string>{"--x", "1"}));     // unquoted: split
  EXPECT_EQ(shell_words("\"$A\"", v).words, (std::vector<std::string>{"--x 1"}));   // quoted: one word
  EXPECT_EQ(shell_words("${ARR[@]}", v).words, (std::vector<std::string>{"--p", "q", "r"}));
  EXPECT_EQ(shell_words("\"${ARR[@]}\"", v).words, (std::vector<std::string>{"--p", "q r"}));
  EXPECT_EQ(shell_words("${ARR[1]}x", v).words, (std::vector<std::string>{"q", "rx"}));
  EXPECT_EQ(shell_words("${MISSING:-8} ${E:-d} ${E-d} ${N:+set}", v).words, (std::vector<std::string>{"8", "d", "set"}));
  EXPECT_EQ(shell_words("$(( $N * (2 + N) )) $((N/3))", v).words, (std::vector<std::string>{"24", "1"}));
}

TEST(ShellWords, UnresolvedExpansionsStayLiteralAndAreListed) {
  const auto c = shell_words("--a $UNSET --b $(hostname) --c ${X/y/z} --d $1");
  EXPECT_EQ(c.words, (std::vector<std::string>{"--a", "$UNSET", "--b", "$(hostname)", "--c", "${X/y/z}", "--d", "$1"}));
  EXPECT_EQ(c.unresolved, (std::vector<std::string>{"$UNSET", "$(hostname)", "${X/y/z}", "$1"}));
}

TEST(ShellWords, StopsAtPipesAndDropsRedirections) {
  EXPECT_EQ(shell_words("run --a 1 2>&1 > out.log | tee x; echo done").words, (std::vector<std::string>{"run", "--a", "1"}));
  EXPECT_EQ(shell_words("run --a 1 &> all.log").words, (std::vector<std::string>{"run", "--a", "1"}));
}

// The shape of Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh: variables, arrays, arithmetic.
const char* kScript = R"(#!/bin/bash
# Runs a MoE model: the launch line below is what lcplan reads.
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=4
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
SEQ=${SEQ_LEN:-131072}
TRAIN_SCRIPT=pretrain_gpt.py   # an assignment naming the script is not the launch

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr localhost --master_port 6000
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --context-parallel-size 4   # ring attention
    --expert-model-parallel-size 8
    --sequence-parallel
)
TRAINING_ARGS=(
    --seq-length $SEQ --micro-batch-size 1 --global-batch-size 16
    --use-distributed-optimizer --overlap-grad-reduce
    --recompute-granularity full --recompute-method block --recompute-num-layers 4
    --lr 1e-4 --train-iters 500 --bf16
)
TRAINING_ARGS+=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params)
if [ -n "$DEBUG" ]; then echo "debug run of pretrain_gpt.py"; fi

torchrun ${DISTRIBUTED_ARGS[@]} $TRAIN_SCRIPT \
    ${MODEL_PARALLEL_ARGS[@]} \
    "${TRAINING_ARGS[@]}" \
    --data-path $DATA_PATH 2>&1 | tee train.log
)";

TEST(Script, LaunchLineArraysAndWorldSize) {
  const ShellCommand c = launch_command_from_script(kScript, "run.sh");
  EXPECT_EQ(c.line, 30);
  ASSERT_GE(c.words.size(), 2u);
  EXPECT_EQ(c.words[0], "torchrun");
  const MegatronLaunch l = parse_megatron_script(kScript, "run.sh");
  EXPECT_EQ(l.world_size, 32);
  EXPECT_TRUE(l.ignored.empty()) << l.ignored.front();
  const Plan p = finish_megatron_plan(l, zoo("qwen3-30b-a3b"), l.world_size);
  EXPECT_EQ(p.seq_len, 131072);
  EXPECT_EQ(p.parallel.cp, 4);
  EXPECT_EQ(p.parallel.ep, 8);
  EXPECT_EQ(p.optimizer_sharding, OptimizerSharding::Fsdp);
  EXPECT_EQ(p.recompute, Recompute::Full);
  EXPECT_EQ(p.recompute_layers, 4);
  EXPECT_EQ(p.global_batch, 16);
}

TEST(Script, CommandInAVariableAndEval) {
  const char* s = "CMD=\"torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096\"\n"
                  "eval $CMD\n";
  const MegatronLaunch l = parse_megatron_script(s, "run.sh");
  EXPECT_EQ(l.world_size, 16);
  EXPECT_EQ(l.plan.parallel.tp, 2);
  EXPECT_EQ(l.plan.seq_len, 4096);
}

TEST(Script, AFileOfFlagsAlone) {
  const MegatronLaunch l = parse_megatron_script("# flags\n--tensor-model-parallel-size 4 \\\n --seq-length=8192\n", "flags.txt");
  EXPECT_EQ(l.plan.parallel.tp, 4);
  EXPECT_EQ(l.plan.seq_len, 8192);
}

TEST(Script, UnclosedQuoteIsOneSentenceNamingTheLine) {
  const std::string e = error_of([] { parse_megatron_script("A=1\nB=\"open\ntorchrun pretrain_gpt.py\n", "run.sh"); });
  EXPECT_NE(e.find("run.sh: line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("never closed"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------------------------
// Every flag lcplan reads

struct FlagCase {
  std::string args;
  std::function<bool(const Plan&)> holds;
  std::string model = "qwen3-30b-a3b";
  int gpus = 64;
};

TEST(Flags, EveryPlanFlagIsRead) {
  const std::vector<FlagCase> cases = {
      {"--tensor-model-parallel-size 2 --sequence-parallel", [](const Plan& p) { return p.parallel.tp == 2 && p.sequence_parallel; }},
      {"--tensor-model-parallel-size=2", [](const Plan& p) { return p.parallel.tp == 2 && !p.sequence_parallel; }},
      {"--pipeline-model-parallel-size 4", [](const Plan& p) { return p.parallel.pp == 4 && p.parallel.vpp == 1; }},
      {"--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3", [](const Plan& p) { return p.parallel.vpp == 4; }},
      {"--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2", [](const Plan& p) { return p.parallel.vpp == 2; }},
      {"--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 64 "
       "--microbatch-group-size-per-virtual-pipeline-stage 8", [](const Plan& p) { return p.microbatch_group == 8; }},
      // Megatron's default value (pp) and a group without virtual stages read as the default.
      {"--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
       "--microbatch-group-size-per-virtual-pipeline-stage 4", [](const Plan& p) { return p.microbatch_group == 0; }},
      {"--tensor-model-parallel-size 8 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
       "--distribute-saved-activations", [](const Plan& p) { return p.distribute_saved_activations && !p.sequence_parallel; },
       "llama-3.1-70b"},
      {"--pipeline-model-parallel-size 4 --microbatch-group-size-per-virtual-pipeline-stage 8",
       [](const Plan& p) { return p.microbatch_group == 0 && p.parallel.vpp == 1; }},
      {"--context-parallel-size 4 --cp-comm-type p2p", [](const Plan& p) { return p.parallel.cp == 4; }},
      {"--expert-model-parallel-size 8", [](const Plan& p) { return p.parallel.ep == 8 && p.parallel.etp == 1; }},
      // Expert TP defaults to TP on a MoE model (arguments.py), to 1 on a dense one.
      {"--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8", [](const Plan& p) { return p.parallel.etp == 2; }},
      {"--tensor-model-parallel-size 8", [](const Plan& p) { return p.parallel.etp == 1; }, "llama-3.1-70b"},
      {"--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8 --expert-tensor-parallel-size 1",
       [](const Plan& p) { return p.parallel.etp == 1; }},
      {"--micro-batch-size 2 --global-batch-size 256", [](const Plan& p) { return p.micro_batch == 2 && p.global_batch == 256; }},
      // Megatron's default global batch: micro batch x dp (64 GPUs / cp 2 = dp 32).
      {"--micro-batch-size 2 --context-parallel-size 2", [](const Plan& p) { return p.global_batch == 64; }},
      {"--seq-length 32768", [](const Plan& p) { return p.seq_len == 32768; }},
      {"--encoder-seq-length 16384", [](const Plan& p) { return p.seq_len == 16384; }},
      {"--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 10 --decoder-last-pipeline-num-layers 10",
       [](const Plan& p) { return p.pipeline.first_stage_layers == 10 && p.pipeline.last_stage_layers == 10; }},
      {"--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout \"Ettt|(t*14|)*2t*17L\"",
       [](const Plan& p) { return p.pipeline.chunk_layers == std::vector<int>{3, 14, 14, 17}; }},
      // The account-for split equal to lcplan's automatic one stays automatic.
      {"--pipeline-model-parallel-size 5 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
       [](const Plan& p) { return p.pipeline.empty() && p.parallel.pp == 5; }, "qwen3-30b-a3b", 40},
      {"--pipeline-model-parallel-size 7 --account-for-loss-in-pipeline-split",
       [](const Plan& p) { return p.pipeline.chunk_layers == std::vector<int>{7, 7, 7, 7, 7, 7, 6}; }, "qwen3-30b-a3b", 56},
      {"--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather",
       [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::DistOpt; }},
      {"", [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::None && p.precision == Precision::BF16; }},
      {"--use-torch-fsdp2", [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::Fsdp; }},
      {"--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer",
       [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::Fsdp; }},
      {"--use-megatron-fsdp --data-parallel-sharding-strategy optim", [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::DistOpt; }},
      {"--use-megatron-fsdp", [](const Plan& p) { return p.optimizer_sharding == OptimizerSharding::None; }},
      {"--optimizer-cpu-offload --use-distributed-optimizer", [](const Plan& p) { return p.offload.optimizer; }},
      {"--optimizer-cpu-offload --optimizer-offload-fraction 0", [](const Plan& p) { return !p.offload.optimizer; }},
      {"--cpu-offloading --cpu-offloading-num-layers 47", [](const Plan& p) { return p.offload.activations; }},
      {"--cpu-offloading", [](const Plan& p) { return !p.offload.activations; }},  // default: 0 layers
      {"--recompute-granularity selective", [](const Plan& p) { return p.recompute == Recompute::Selective; }},
      {"--recompute-activations", [](const Plan& p) { return p.recompute == Recompute::Selective; }},
      {"--recompute-granularity selective --recompute-modules core_attn layernorm moe_act",
       [](const Plan& p) { return p.recompute == Recompute::Selective; }},
      {"--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
       [](const Plan& p) { return p.recompute == Recompute::Full && p.recompute_layers == 0; }},
      {"--recompute-granularity full --recompute-method block --recompute-num-layers 3",
       [](const Plan& p) { return p.recompute == Recompute::Full && p.recompute_layers == 3; }},
      {"--cross-entropy-loss-fusion --cross-entropy-fusion-impl linear", [](const Plan& p) { return p.linear_ce; }},
      {"--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", [](const Plan& p) { return !p.linear_ce; }},
      {"--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity", [](const Plan& p) { return p.moe.capacity_factor == 1.25; }},
      {"--moe-router-force-load-balancing", [](const Plan& p) { return p.moe.routing_imbalance == 1.0; }},
      {"--expert-model-parallel-size 8 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
       "--moe-expert-rank-capacity-factor 1.5 --moe-paged-stash",
       [](const Plan& p) { return p.moe.rank_capacity_factor == 1.5 && p.moe.paged_stash; }},
      {"--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm --delay-wgrad-compute",
       [](const Plan& p) { return p.moe.ep_chunks == 1; }},  // the calibration's ep_overlap, not a plan field
      {"--bf16", [](const Plan& p) { return p.precision == Precision::BF16; }},
      {"--bf16 --fp8-format hybrid --fp8-recipe tensorwise", [](const Plan& p) { return p.precision == Precision::FP8; }},
      {"--bf16 --fp8-format e4m3", [](const Plan& p) { return p.precision == Precision::FP8; }},  // delayed by default
      {"--bf16 --fp8-format e4m3 --fp8-recipe blockwise", [](const Plan& p) { return p.precision == Precision::FP8; }},
      {"--bf16 --fp8-format e4m3 --fp8-recipe mxfp8", [](const Plan& p) { return p.precision == Precision::MXFP8; }},
      {"--bf16 --fp4-format e2m1 --fp4-recipe nvfp4", [](const Plan& p) { return p.precision == Precision::NVFP4; }},
      {"--nnodes 2 --nproc-per-node 8", [](const Plan&) { return true; }},
  };
  for (const FlagCase& c : cases) {
    SCOPED_TRACE(c.args);
    Plan p;
    ASSERT_EQ(error_of([&] { p = plan_of(c.args, c.model, c.gpus); }), "");
    EXPECT_TRUE(c.holds(p)) << plan_to_json(p).dump();
  }
}

TEST(Flags, WorldSizeFromTheLauncher) {
  EXPECT_EQ(parse_megatron_args("torchrun --nnodes=4 --nproc_per_node=8 pretrain_gpt.py --seq-length 4096").world_size, 32);
  EXPECT_EQ(parse_megatron_args("WORLD_SIZE=16 python pretrain_gpt.py --seq-length 4096").world_size, 16);
  EXPECT_EQ(parse_megatron_args("--seq-length 4096").world_size, 0);
  // Left to a shell variable: unknown here (the CLI asks for --gpus), not an error.
  EXPECT_EQ(parse_megatron_args("torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py --bf16").world_size, 0);
  EXPECT_EQ(parse_megatron_args("WORLD_SIZE=$N python pretrain_gpt.py --bf16").world_size, 0);
}

TEST(Flags, ApproximationsAreNotedOnce) {
  // What lcplan still reads approximately: a per-layer CP type, a recompute module it does not model, a legacy
  // dispatcher, fp16 as bf16 (and a flag given twice).
  const MegatronLaunch l = parse_megatron_args(
      "--context-parallel-size 2 --cp-comm-type a2a p2p --recompute-granularity selective --recompute-modules core_attn "
      "gdn_norm_out --moe-token-dispatcher-type alltoall_seq --fp16 --seq-length 4096 --seq-length 8192");
  ASSERT_EQ(l.notes.size(), 5u);
  EXPECT_NE(l.notes[0].find("--seq-length is given twice"), std::string::npos) << l.notes[0];
  EXPECT_EQ(l.plan.seq_len, 8192);  // argparse: the last one wins
  std::string all;
  for (const auto& n : l.notes) all += n + "\n";
  for (const char* flag : {"--cp-comm-type per layer (a2a p2p)", "--recompute-modules gdn_norm_out", "alltoall_seq", "--fp16"})
    EXPECT_NE(all.find(flag), std::string::npos) << all;
  // What used to be read approximately is a plan field now, read without a note: the CP type, uniform recompute of
  // groups of layers, capacity without padding.
  const MegatronLaunch exact = parse_megatron_args(
      "--context-parallel-size 2 --cp-comm-type a2a --recompute-granularity full --recompute-method uniform "
      "--recompute-num-layers 2 --moe-expert-capacity-factor 1.0 --bf16 --seq-length 4096");
  EXPECT_TRUE(exact.notes.empty()) << exact.notes.front();
  EXPECT_EQ(exact.plan.comm.cp, CpComm::A2A);
  EXPECT_EQ(exact.plan.recompute_method, RecomputeMethod::Uniform);
  EXPECT_EQ(exact.plan.recompute_layers, 2);
  EXPECT_FALSE(exact.plan.moe.pad_to_capacity);
}

TEST(Flags, UnknownFlagsAreListedOnceInOrder) {
  const MegatronLaunch l = parse_megatron_args(
      "torchrun --rdzv-backend c10d pretrain_gpt.py --frobnicate 3 --lr 1e-4 --frobnicate 4 -tp 2 --zeta --use-flash-attn");
  EXPECT_EQ(l.ignored, (std::vector<std::string>{"--frobnicate", "-tp", "--zeta"}));
}

TEST(Flags, BadValuesAreOneSentenceNamingTheFlag) {
  EXPECT_NE(error_of([] { parse_megatron_args("--tensor-model-parallel-size two"); }).find("--tensor-model-parallel-size \"two\" is not a whole number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_megatron_args("--seq-length $SEQ"); }).find("\"$SEQ\" depends on a shell variable"), std::string::npos);
  EXPECT_NE(error_of([] { parse_megatron_args("--fp8-recipe fancy --fp8-format e4m3"); }).find("tensorwise, delayed, blockwise, mxfp8"), std::string::npos);
  EXPECT_NE(error_of([] { parse_megatron_args("--sequence-parallel yes"); }).find("is a switch"), std::string::npos);
  EXPECT_NE(error_of([] { parse_megatron_args("--seq-length"); }).find("needs a value"), std::string::npos);
  EXPECT_NE(error_of([] { parse_megatron_args("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout \"Et|tX|L\""); }).find("\"X\""), std::string::npos);
}

// Megatron-LM's own rules (arguments.py, transformer_config.py): each contradiction is one sentence naming both.
TEST(Flags, ContradictionsNameBothFlags) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--use-distributed-optimizer --use-torch-fsdp2", {"--use-torch-fsdp2", "--use-distributed-optimizer"}},
      {"--use-torch-fsdp2 --use-megatron-fsdp", {"--use-torch-fsdp2", "--use-megatron-fsdp"}},
      {"--recompute-granularity full", {"--recompute-granularity full", "--recompute-method"}},
      {"--recompute-granularity full --recompute-method block", {"--recompute-method block", "--recompute-num-layers"}},
      {"--recompute-granularity selective --recompute-num-layers 2", {"--recompute-num-layers", "--recompute-granularity selective"}},
      {"--recompute-activations --recompute-granularity full", {"--recompute-activations", "--recompute-granularity full"}},
      {"--fp8-format hybrid --fp4-format e2m1", {"--fp8-format", "--fp4-format"}},
      {"--bf16 --fp16", {"--bf16", "--fp16"}},
      {"--pipeline-model-parallel-size 3 --pipeline-model-parallel-layout \"Et|tt|tt|tL\"", {"--pipeline-model-parallel-layout", "--pipeline-model-parallel-size 3"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tL' --decoder-first-pipeline-num-layers 1",
       {"--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et|tL' --account-for-loss-in-pipeline-split",
       {"--pipeline-model-parallel-layout", "--account-for-loss-in-pipeline-split"}},
      {"--num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
       {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"}},
      {"--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 4 --account-for-embedding-in-pipeline-split",
       {"--decoder-first-pipeline-num-layers", "--account-for-embedding-in-pipeline-split"}},
      {"--pipeline-model-parallel-size 4 --decoder-last-pipeline-num-layers 4 --num-layers-per-virtual-pipeline-stage 2",
       {"--decoder-last-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage"}},
      {"--moe-pad-expert-input-to-capacity", {"--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor"}},
      {"--tensor-model-parallel-size 2 --expert-model-parallel-size 8", {"--expert-model-parallel-size 8", "--sequence-parallel"}},
      {"--cpu-offloading --pipeline-model-parallel-size 2", {"--cpu-offloading", "--pipeline-model-parallel-size 2"}},
      {"--overlap-param-gather", {"--overlap-param-gather", "--use-distributed-optimizer"}},
      {"WORLD_SIZE=16 torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py", {"WORLD_SIZE 16", "--nnodes 4"}},
      {"torchrun --nnodes 4 pretrain_gpt.py", {"--nnodes", "--nproc-per-node"}},
  };
  for (const auto& [args, words] : cases) {
    const std::string e = error_of([&args = args] { parse_megatron_args(args); });
    ASSERT_FALSE(e.empty()) << args << ": accepted";
    for (const auto& w : words) EXPECT_NE(e.find(w), std::string::npos) << args << ": " << e;
    EXPECT_EQ(e.find(". "), std::string::npos) << "more than one sentence: " << e;
  }
}

// Contradictions that need the model: layout vs layers / MTP / vpp, shape flags vs --model.
TEST(Flags, ContradictionsWithTheModel) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout \"E(t*20)|(t*20)L\"", {"places 40", "48"}},
      {"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout \"E(t*24)|(t*24)mL\"", {"MTP", "(m)"}},
      {"--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3 --pipeline-model-parallel-layout \"E(t*24)|(t*24)L\"",
       {"--num-virtual-stages-per-pipeline-rank 3", "--pipeline-model-parallel-layout"}},
      {"--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5", {"--num-layers-per-virtual-pipeline-stage 5", "48"}},
      {"--num-layers 40", {"--num-layers 40", "qwen3-30b-a3b", "48"}},
      {"--num-experts 64", {"--num-experts 64", "128"}},
      {"--cpu-offloading --cpu-offloading-num-layers 48", {"--cpu-offloading-num-layers 48", "0 to 47"}},
  };
  for (const auto& [args, words] : cases) {
    const std::string e = error_of([&args = args] { plan_of(args); });
    ASSERT_FALSE(e.empty()) << args << ": accepted";
    for (const auto& w : words) EXPECT_NE(e.find(w), std::string::npos) << args << ": " << e;
  }
}

TEST(Flags, MegatronBridgeOverrides) {
  const Plan p = plan_of(
      "python run.py model.tensor_model_parallel_size=2 model.sequence_parallel=True model.expert_model_parallel_size=8 "
      "model.context_parallel_size=2 train.micro_batch_size=1 train.global_batch_size=128 model.seq_length=8192 "
      "ddp.use_distributed_optimizer=true model.recompute_granularity=full model.recompute_method=uniform "
      "model.recompute_num_layers=1 mixed_precision=bf16_with_mxfp8_mixed model.virtual_pipeline_model_parallel_size=None");
  EXPECT_EQ(p.parallel.tp, 2);
  EXPECT_TRUE(p.sequence_parallel);
  EXPECT_EQ(p.parallel.ep, 8);
  EXPECT_EQ(p.parallel.cp, 2);
  EXPECT_EQ(p.global_batch, 128);
  EXPECT_EQ(p.seq_len, 8192);
  EXPECT_EQ(p.optimizer_sharding, OptimizerSharding::DistOpt);
  EXPECT_EQ(p.recompute, Recompute::Full);
  EXPECT_EQ(p.precision, Precision::MXFP8);
  // A config field named otherwise than its flag (ModelParallelConfig microbatch_group_size_per_vp_stage).
  const Plan g = plan_of(
      "python run.py model.pipeline_model_parallel_size=4 model.virtual_pipeline_model_parallel_size=2 "
      "train.global_batch_size=256 model.microbatch_group_size_per_vp_stage=8 model.tensor_model_parallel_size=4 "
      "model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1 "
      "model.distribute_saved_activations=true");
  EXPECT_EQ(g.microbatch_group, 8);
  EXPECT_TRUE(g.distribute_saved_activations);
}

TEST(Layout, Grammar) {
  EXPECT_EQ(parse_pipeline_layout("Et|(tt|)*30mL").layers.size(), 32u);
  EXPECT_EQ(parse_pipeline_layout("Et|(tt|)*30mL").layers.back(), 0);
  EXPECT_EQ(parse_pipeline_layout("Et|(tt|)*30mL").mtp, 1);
  EXPECT_EQ(parse_pipeline_layout("E|t*3|((tt)*2|)*2L").layers, (std::vector<int>{0, 3, 4, 4, 0}));
  EXPECT_NE(error_of([] { parse_pipeline_layout("t|EL"); }).find("embedding E"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pipeline_layout("Et|Lt"); }).find("loss L"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pipeline_layout("Etm|tL"); }).find("MTP"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pipeline_layout("E(t|tL"); }).find("never closes"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pipeline_layout("(t*99999)*99999"); }).find("too many"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------------
// The model from shape flags

void expect_same_model(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.gated_mlp, b.gated_mlp);
  EXPECT_EQ(a.mtp_layers, b.mtp_layers);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  bool dense = false;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].mixer, b.layers[i].mixer) << i;
    EXPECT_EQ(a.layers[i].ffn, b.layers[i].ffn) << i;
    dense = dense || a.layers[i].ffn == FfnKind::Dense;
  }
  if (dense) {
    EXPECT_EQ(a.dense_ffn, b.dense_ffn);
  }
  if (a.layers[0].mixer == MixerKind::FullAttention) {
    EXPECT_EQ(a.attn.heads, b.attn.heads);
    EXPECT_EQ(a.attn.kv_heads, b.attn.kv_heads);
    EXPECT_EQ(a.attn.head_dim, b.attn.head_dim);
    EXPECT_EQ(a.attn.qkv_bias, b.attn.qkv_bias);
    EXPECT_EQ(a.attn.o_bias, b.attn.o_bias);
    EXPECT_EQ(a.attn.qk_norm, b.attn.qk_norm);
    EXPECT_DOUBLE_EQ(a.attn.partial_rotary, b.attn.partial_rotary);
  } else {
    EXPECT_EQ(a.mla.heads, b.mla.heads);
    EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
    EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
    EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
    EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
    EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
  }
  if (a.moe.num_experts > 0) {
    EXPECT_EQ(a.moe.num_experts, b.moe.num_experts);
    EXPECT_EQ(a.moe.top_k, b.moe.top_k);
    EXPECT_EQ(a.moe.expert_ffn, b.moe.expert_ffn);
    EXPECT_EQ(a.moe.shared_experts * a.moe.shared_ffn, b.moe.shared_experts * b.moe.shared_ffn);
    EXPECT_EQ(a.moe.shared_expert_gate, b.moe.shared_expert_gate);
    EXPECT_EQ(a.moe.router, b.moe.router);
    EXPECT_EQ(a.moe.n_group, b.moe.n_group);
    EXPECT_EQ(a.moe.topk_group, b.moe.topk_group);
    EXPECT_EQ(a.moe.latent, b.moe.latent);
  }
  // And what the estimator reads of it: the parameter count.
  EXPECT_DOUBLE_EQ(count_params(a).total_with_mtp, count_params(b).total_with_mtp);
}

TEST(ModelFlags, ZooModelsRoundTrip) {
  for (const char* name : {"llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "kimi-k2",
                           "moonlight-16b-a3b", "glm-4.5", "mixtral-8x7b"}) {
    SCOPED_TRACE(name);
    const ModelSpec& m = zoo(name);
    const std::string flags = megatron_model_flags(m);
    ASSERT_FALSE(flags.empty());
    const MegatronLaunch l = parse_megatron_args(flags);
    EXPECT_TRUE(l.ignored.empty()) << l.ignored.front();
    ASSERT_TRUE(l.model.has_value()) << flags;
    expect_same_model(m, *l.model);
  }
}

// Latent MoE (--moe-latent-size): the experts' width; written back, checked against a named model, noted without
// experts.
TEST(ModelFlags, LatentMoe) {
  ModelSpec m = zoo("qwen3-30b-a3b");
  m.moe.latent = 512;
  const std::string flags = megatron_model_flags(m);
  EXPECT_NE(flags.find("--moe-latent-size 512"), std::string::npos) << flags;
  const MegatronLaunch l = parse_megatron_args(flags);
  ASSERT_TRUE(l.model.has_value());
  expect_same_model(m, *l.model);
  const std::string e = error_of([] { plan_of("--moe-latent-size 256"); });
  EXPECT_NE(e.find("--moe-latent-size 256"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3-30b-a3b"), std::string::npos) << e;
  const MegatronLaunch dense = parse_megatron_args("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 "
                                                   "--vocab-size 1000 --moe-latent-size 256");
  ASSERT_TRUE(dense.model.has_value());
  EXPECT_EQ(dense.model->moe.latent, 0);
  bool noted = false;
  for (const std::string& n : dense.notes) noted = noted || n.find("--moe-latent-size has no effect") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(ModelFlags, HybridModelsHaveNone) {
  EXPECT_EQ(megatron_model_flags(zoo("qwen3.5-35b-a3b")), "");  // gated DeltaNet layers
  EXPECT_EQ(megatron_model_flags(zoo("gpt-oss-120b")), "");     // sliding-window layers, sinks
}

TEST(ModelFlags, MegatronDefaults) {
  const MegatronLaunch l = parse_megatron_args("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --vocab-size 1000 "
                                               "--tensor-model-parallel-size 2 --swiglu");
  ASSERT_TRUE(l.model);
  EXPECT_EQ(l.model->vocab, 1024);         // padded to 128 x tp
  EXPECT_EQ(l.model->dense_ffn, 2688);     // int(4h*2/3 / 64) * 64
  EXPECT_EQ(l.model->attn.kv_heads, 8);    // no GQA without --group-query-attention
  EXPECT_EQ(l.model->attn.head_dim, 128);
  EXPECT_TRUE(l.model->tied_embeddings);
  EXPECT_TRUE(l.model->attn.o_bias);       // bias in linear layers unless --disable-bias-linear
  const MegatronLaunch part = parse_megatron_args("--num-layers 4 --hidden-size 1024");
  EXPECT_FALSE(part.model);
  EXPECT_EQ(part.missing_shape, (std::vector<std::string>{"--num-attention-heads", "--vocab-size"}));
}

TEST(ModelFlags, MoeLayerFreq) {
  const std::string base = "--num-layers 6 --hidden-size 256 --num-attention-heads 4 --padded-vocab-size 512 --num-experts 8 ";
  auto pattern = [&](const std::string& freq) {
    const MegatronLaunch l = parse_megatron_args(base + "--moe-layer-freq " + freq);
    std::string s;
    for (const auto& layer : l.model->layers) s += layer.ffn == FfnKind::MoE ? '1' : '0';
    return s;
  };
  EXPECT_EQ(pattern("2"), "101010");
  EXPECT_EQ(pattern("\"([0]*2+[1]*4)\""), "001111");
  EXPECT_EQ(pattern("[1,0,1,1,0,1]"), "101101");
  EXPECT_NE(error_of([&] { parse_megatron_args(base + "--moe-layer-freq \"[1]*5\""); }).find("lists 5 layers"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_megatron_args(base + "--moe-layer-freq \"[2]*6\""); }).find("not valid"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------------
// Round trip: megatron_flags(plan) read back gives the same plan (fields: see the top of this file).

struct RoundTrip {
  std::string what, model;
  std::function<void(Plan&)> set;
};

TEST(RoundTrip, EmittedFlagsParseBackToThePlan) {
  const std::vector<RoundTrip> table = {
      {"FSDP + CP + EP, full recompute, linear CE, chunked EP", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 32, 131072);
         p.parallel.cp = 4, p.parallel.ep = 8, p.optimizer_sharding = OptimizerSharding::Fsdp, p.recompute = Recompute::Full;
         // (no cross-microbatch EP overlap: Megatron refuses it with full recompute, a plan rule now)
         p.linear_ce = true, p.moe.ep_chunks = 2, p.global_batch = 16;
       }},
      {"DeepEP dispatch, all-to-all overlap, no MTP on a model with MTP", "deepseek-v3", [](Plan& p) {
         p = zoo_plan(p.model, 256, 4096);
         p.parallel.ep = 64, p.moe.dispatcher = MoeDispatcher::DeepEP, p.moe.a2a_overlap = true, p.mtp_layers = 0;
         p.global_batch = 512, p.precision = Precision::FP8;
       }},
      {"EP with ETP, TP + SP, selective recompute, FP8", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 32768);
         p.parallel.tp = 2, p.parallel.ep = 8, p.parallel.etp = 2, p.recompute = Recompute::Selective;
         p.precision = Precision::FP8;
       }},
      {"VPP, even split, dist opt", "llama-3.1-70b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 8192);
         p.parallel.tp = 8, p.parallel.pp = 4, p.parallel.vpp = 5, p.global_batch = 64;
       }},
      {"uneven first/last stage layers with VPP, no SP", "llama-3.1-70b", [](Plan& p) {
         p = zoo_plan(p.model, 32, 8192);
         p.parallel.tp = 8, p.parallel.pp = 4, p.parallel.vpp = 2, p.sequence_parallel = false;
         p.pipeline.first_stage_layers = 18, p.pipeline.last_stage_layers = 18;
       }},
      {"uneven first stage only", "llama-3.1-70b", [](Plan& p) {
         p = zoo_plan(p.model, 32, 8192);
         p.parallel.tp = 8, p.parallel.pp = 4, p.pipeline.first_stage_layers = 17;
       }},
      {"explicit layers per virtual stage, MTP, MXFP8, block recompute", "deepseek-v3", [](Plan& p) {
         p = zoo_plan(p.model, 256, 4096);
         p.parallel.pp = 8, p.parallel.ep = 32, p.pipeline.chunk_layers = {5, 8, 8, 8, 8, 8, 8, 8};
         p.precision = Precision::MXFP8, p.recompute = Recompute::Full, p.recompute_layers = 2, p.global_batch = 512;
       }},
      {"explicit layers with VPP", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 32, 16384);
         p.parallel.pp = 2, p.parallel.vpp = 2, p.parallel.ep = 8, p.pipeline.chunk_layers = {10, 14, 14, 10};
       }},
      {"balanced automatic split (layout string)", "deepseek-v3", [](Plan& p) {
         p = zoo_plan(p.model, 256, 4096);
         p.parallel.pp = 8, p.parallel.ep = 32;
       }},
      {"embedding/loss accounted split with VPP", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 16, 8192);
         p.parallel.pp = 2, p.parallel.vpp = 5, p.parallel.ep = 8, p.optimizer_sharding = OptimizerSharding::None;
       }},
      {"offload optimizer and activations, NVFP4, no sharding", "llama-3.1-8b", [](Plan& p) {
         p = zoo_plan(p.model, 8, 8192);
         p.offload.optimizer = true, p.offload.activations = true, p.precision = Precision::NVFP4;
         p.offload.optimizer_fraction = 0.1111444;  // seven digits: the flag carries them all (fuzz run_settings)
         p.optimizer_sharding = OptimizerSharding::None;
       }},
      {"token dropping with padding to capacity", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 4096);
         p.parallel.ep = 16, p.moe.capacity_factor = 1.2345678, p.micro_batch = 2, p.global_batch = 256;
       }},
      {"HybridEP with a per-rank budget and the paged stash under full-iteration CUDA graphs", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 4096);
         p.parallel.ep = 8, p.moe.dispatcher = MoeDispatcher::HybridEP, p.moe.rank_capacity_factor = 1.5;
         p.moe.paged_stash = true, p.cuda_graphs.impl = GraphImpl::FullIteration, p.global_batch = 256;
       }},
      {"a share of the fine-grained offloaded modules", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 8, 4096);
         p.parallel.ep = 8, p.offload.modules = kOffloadCoreAttn | kOffloadExpertFc1, p.offload.modules_fraction = 0.5;
       }},
      {"full recompute with distributed checkpoints, no SP", "llama-3.1-70b", [](Plan& p) {
         p = zoo_plan(p.model, 32, 8192);
         p.parallel.tp = 8, p.parallel.pp = 4, p.sequence_parallel = false, p.recompute = Recompute::Full;
         p.distribute_saved_activations = true;
       }},
      {"VPP with a breadth-first microbatch group", "llama-3.1-70b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 8192);
         p.parallel.tp = 8, p.parallel.pp = 4, p.parallel.vpp = 5, p.global_batch = 64, p.microbatch_group = 32;
       }},
      {"distributed optimizer in 4 instances", "qwen3-30b-a3b", [](Plan& p) {
         p = zoo_plan(p.model, 64, 4096);
         p.parallel.ep = 8, p.optimizer.instances = 4, p.global_batch = 256;
       }},
      {"TP + PP + CP + EP at once, DeepSeek", "deepseek-v3", [](Plan& p) {
         p = zoo_plan(p.model, 1024, 32768);
         p.parallel.tp = 2, p.parallel.pp = 8, p.parallel.cp = 2, p.parallel.ep = 64, p.parallel.etp = 1;
         p.pipeline.first_stage_layers = 5, p.pipeline.last_stage_layers = 8, p.recompute = Recompute::Full;
       }},
  };
  for (const RoundTrip& c : table) {
    SCOPED_TRACE(c.what);
    Plan p;
    p.model = c.model;
    c.set(p);
    const ModelSpec& m = zoo(c.model);
    ASSERT_EQ(error_of([&] { require_valid_plan(m, p); }), "") << "the table's plan itself is invalid";
    const std::string flags = megatron_flags(p, m);
    MegatronLaunch l;
    ASSERT_EQ(error_of([&] { l = parse_megatron_args(flags); }), "") << flags;
    EXPECT_TRUE(l.ignored.empty()) << "emitted flag not read back: " << l.ignored.front() << "\n" << flags;
    EXPECT_TRUE(l.notes.empty()) << "emitted flag read approximately: " << l.notes.front() << "\n" << flags;
    Plan back;
    std::vector<std::string> notes;
    ASSERT_EQ(error_of([&] { back = finish_megatron_plan(l, m, p.gpus, &notes); }), "") << flags;
    EXPECT_TRUE(notes.empty()) << notes.front();
    EXPECT_EQ(megatron_plan_difference(p, back), "") << flags;
    // Chunked EP has no Megatron flag: a comment line names it, and it reads back as ep_chunks 1.
    if (p.moe.ep_chunks > 1) {
      EXPECT_NE(flags.find("# ep_chunks 2:"), std::string::npos);
      EXPECT_EQ(back.moe.ep_chunks, 1);
    }
    EXPECT_EQ(p.moe.a2a_overlap, flags.find("--overlap-moe-expert-parallel-comm --delay-wgrad-compute") != std::string::npos);
    EXPECT_EQ(p.moe.dispatcher == MoeDispatcher::DeepEP, flags.find("--moe-flex-dispatcher-backend deepep") != std::string::npos);
    if (p.linear_ce) {
      EXPECT_NE(flags.find("development branch"), std::string::npos);
    }
    EXPECT_NE(flags.find("# no Megatron flag: hardware"), std::string::npos);
    // The plan read back is valid for the model as well.
    EXPECT_EQ(error_of([&] { require_valid_plan(m, back); }), "");
  }
}

TEST(RoundTrip, DifferenceNamesTheField) {
  Plan a = zoo_plan("x", 8, 4096), b = a;
  b.precision = Precision::FP8;
  EXPECT_EQ(megatron_plan_difference(a, b), "precision: bf16 vs fp8");
  b = a;
  b.moe.routing_imbalance = 1.5, b.moe.ep_chunks = 4, b.hardware = "b200";  // not expressible: not compared
  EXPECT_EQ(megatron_plan_difference(a, b), "");
  b.parallel.tp = a.parallel.tp = 1, b.sequence_parallel = false;  // sequence parallelism means nothing at tp 1
  EXPECT_EQ(megatron_plan_difference(a, b), "");
}

}  // namespace
}  // namespace lcplan
