// CLI robustness: runs the built `lcplan` binary over a table of bad invocations (each must exit non-zero, print
// exactly one line on stderr that is one sentence, and nothing on stdout that could be mistaken for a result) and
// a few good ones that must succeed. Rows about file permissions run lcplan as nobody when the test runs as root.
#include <gtest/gtest.h>

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/cli_runner.h"

namespace fs = std::filesystem;

namespace {

using lcplan::testing::Outcome;
using lcplan::testing::slurp;
using lcplan::testing::become_nobody_if_root;

// Scratch folder for this test binary: files the table refers to (bad configs, an unreadable file, a directory).
const fs::path& scratch() {
  static const fs::path dir = [] {
    const fs::path d = lcplan::testing::scratch("lcplan_cli_test");
    fs::create_directories(d / "a_directory.json");
    // Readable by nobody, who runs the permission rows when the test runs as root.
    fs::permissions(d, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
    ::mkfifo((d / "pipe.json").c_str(), 0644);
    std::ofstream(d / "bad_config.json") << R"({"model_type": "llama", "hidden_size": "wide", "num_hidden_layers": 4,
      "vocab_size": 1000, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 64})";
    std::ofstream(d / "not_json.json") << "{ this is not json";
    std::ofstream(d / "unreadable.json") << "{}";
    ::chmod((d / "unreadable.json").c_str(), 0);
    std::ofstream(d / "bad_plan.json") << R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": "128k", "tensor_parallel": 2})";
    std::ofstream(d / "empty_measurements.json") << "[]";
    std::ofstream(d / "other_plan_runs.json")
        << R"([{"id": "x", "plan": {"model": "qwen3.5-35b-a3b", "gpus": 64, "seq_len": 4096}, "peak_bytes": 1e10}])";
    std::ofstream(d / "junk.json", std::ios::binary) << std::string("\x7f" "ELF\0\xff\xfe", 8);
    // Megatron-LM interop inputs: a valid recipe, logs that cannot be ingested, a script with an unclosed quote.
    // An lcplan-exec record of a 64x-scaled CPU run whose plan is the full model on H100 (issue 28 item 2).
    std::ofstream(d / "scaled_run.json")
        << R"([{"id": "cpu-scaled", "plan": {"model": "qwen3.5-35b-a3b", "hardware": "h100-sxm-80gb", "gpus": 8,
        "seq_len": 4096, "parallel": {"ep": 8}}, "peak_bytes": 6e7, "backend": "cpu",
        "scale": {"factor": 64, "layers_per_kind": 1, "mtp_dropped": 1, "kept_layers": [0, 3]}}])";
    std::ofstream(d / "plan_ok.json") << R"({"model": "qwen3-30b-a3b", "gpus": 32, "seq_len": 4096, "global_batch": 64,
      "parallel": {"ep": 8}})";
    const std::string iteration = " iteration 10/100 | elapsed time per iteration (ms): 1000.0 | global batch size: ";
    std::ofstream(d / "good.log") << iteration << "64 |\n" << iteration << "64 |\n";
    std::ofstream(d / "gb128.log") << iteration << "128 |\n" << iteration << "128 |\n";
    std::ofstream(d / "tp2.log") << "using world size: 32, data-parallel size: 16, context-parallel size: 1, "
                                    "tensor-model-parallel size: 2, pipeline-model-parallel size: 1\n"
                                 << iteration << "64 |\n" << iteration << "64 |\n";
    std::ofstream(d / "no_iterations.log") << "> building GPT model ...\n";
    std::ofstream(d / "crash.log") << "Traceback (most recent call last):\n  File \"pretrain_gpt.py\", line 3\n"
                                      "ValueError: bad value\n";
    std::ofstream(d / "unclosed.sh") << "A=\"open\ntorchrun pretrain_gpt.py --seq-length 4096\n";
    // Issue 28 item 8: a config with no layers, a plan file whose seq_len is 0.
    std::ofstream(d / "no_layers.json") << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 0,
      "vocab_size": 1000, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 64})";
    std::ofstream(d / "seq0.json") << R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": 0})";
    std::ofstream(d / "lengths_ok.txt") << "4096\n65536\n4096\n";
    std::ofstream(d / "lengths_negative.txt") << "4096\n-3\n";
    std::ofstream(d / "lengths_fraction.json") << "[4096, 1.5]";
    std::ofstream(d / "lengths_empty.txt") << "";
    std::ofstream(d / "lengths_too_long.txt") << "4096\n300000\n";
    return d;
  }();
  return dir;
}

std::string path(const char* name) { return (scratch() / name).string(); }

// Whether nobody can run the lcplan binary and read the data folder and the scratch folder (a build tree under a
// private home directory would not be).
bool nobody_can_run_lcplan() {
  static const bool ok = [] {
    const std::string data = std::getenv("LCPLAN_DATA_DIR") ? std::getenv("LCPLAN_DATA_DIR") : LCPLAN_SOURCE_DIR;
    const std::string dir = scratch().string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      become_nobody_if_root();
      const bool can = ::access(LCPLAN_BINARY, X_OK) == 0 && ::access((data + "/models/zoo").c_str(), R_OK | X_OK) == 0 &&
                       ::access(dir.c_str(), R_OK | X_OK) == 0;
      std::_Exit(can ? 0 : 1);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }();
  return ok;
}

// Runs lcplan with the given arguments (no shell), capturing stdout and stderr (tests/common/cli_runner.h).
Outcome run_lcplan(std::vector<std::string> args, bool as_nobody = false) {
  args.insert(args.begin(), LCPLAN_BINARY);
  lcplan::testing::RunOptions opt;
  opt.as_nobody = as_nobody;
  return lcplan::testing::run_program(args, opt);
}

std::string show(const std::vector<std::string>& args) {
  std::string s = "lcplan";
  for (const auto& a : args) s += " " + a;
  return s;
}

// One sentence: a single line, "lcplan: error: " then text without a second sentence (". X" inside) .
void expect_one_sentence(const std::string& err, const std::string& cmd) {
  ASSERT_FALSE(err.empty()) << cmd << ": nothing on stderr";
  ASSERT_EQ(err.back(), '\n') << cmd << ": stderr does not end with a newline: " << err;
  const std::string line = err.substr(0, err.size() - 1);
  EXPECT_EQ(line.find('\n'), std::string::npos) << cmd << ": more than one line on stderr:\n" << err;
  EXPECT_EQ(line.rfind("lcplan: error: ", 0), 0u) << cmd << ": stderr is not an lcplan error sentence: " << err;
  EXPECT_EQ(line.find("internal error"), std::string::npos) << cmd << ": a user mistake reported as a bug: " << err;
  for (size_t i = 0; i + 2 < line.size(); ++i)
    if (line[i] == '.' && line[i + 1] == ' ' && std::isupper(static_cast<unsigned char>(line[i + 2])))
      ADD_FAILURE() << cmd << ": stderr holds more than one sentence: " << err;
}

const std::vector<std::string> kRef = {"--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k"};

// The reference plan's flags with `more` applied: a flag already present gets the new value instead of a repeat.
std::vector<std::string> ref(std::vector<std::string> more) {
  std::vector<std::string> a = kRef;
  for (size_t i = 0; i < more.size(); ++i) {
    const bool has_value = i + 1 < more.size() && more[i + 1].rfind("--", 0) != 0;
    bool replaced = false;
    for (size_t j = 0; has_value && j + 1 < a.size(); j += 2)
      if (a[j] == more[i]) {
        a[j + 1] = more[i + 1];
        replaced = true;
      }
    if (!replaced) {
      a.push_back(more[i]);
      if (has_value) a.push_back(more[i + 1]);
    }
    if (has_value) ++i;
  }
  return a;
}

struct Bad {
  std::string what;
  std::vector<std::string> args;
  std::vector<std::string> mentions;  // words the sentence must contain (the value, the rule, the field)
  bool as_nobody = false;             // run without root's power to read any file
};

std::vector<Bad> bad_invocations() {
  auto est = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"estimate"};
    auto r = ref(more);
    a.insert(a.end(), r.begin(), r.end());
    return a;
  };
  auto rep = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"report"};
    auto r = ref(more);
    a.insert(a.end(), r.begin(), r.end());
    return a;
  };
  auto srch = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"search"};
    auto r = ref(more);
    a.insert(a.end(), r.begin(), r.end());
    return a;
  };
  return {
      {"no command", {}, {}},
      {"unknown command", {"estimat"}, {}},
      {"unknown flag", est({"--tensor-parallel", "2"}), {"--tensor-parallel"}},
      {"unknown flag on models", {"models", "--verbose"}, {"--verbose"}},
      {"missing value at the end", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq"}, {"--seq"}},
      {"missing value in the middle", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "--seq", "128k"}, {"--gpus", "value"}},
      {"empty value", {"estimate", "--model", "", "--gpus", "32", "--seq", "128k"}, {"--model", "empty"}},
      {"flag given twice", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--gpus", "16", "--seq", "128k"},
       {"--gpus", "twice"}},
      {"stray positional argument", {"estimate", "--model", "qwen3.5-35b-a3b", "32", "--seq", "128k"}, {"\"32\""}},
      {"single-dash flag", est({"-tp", "2"}), {"-tp"}},
      {"value given to a switch", est({"--fsdp=yes"}), {"--fsdp"}},
      {"missing model", {"estimate", "--gpus", "32", "--seq", "128k"}, {"model"}},
      {"missing gpus", {"estimate", "--model", "qwen3.5-35b-a3b", "--seq", "128k"}, {"gpus"}},
      {"missing seq", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32"}, {"seq"}},
      {"zero gpus", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "0", "--seq", "128k"}, {"--gpus", "0"}},
      {"negative gpus", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "-8", "--seq", "128k"}, {"--gpus"}},
      {"gpus not a number", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "many", "--seq", "128k"}, {"--gpus", "many"}},
      {"bad size suffix", est({"--seq", "12x"}), {"--seq", "12x"}},
      {"negative size", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "-4"}, {"--seq", "-4"}},
      {"zero size", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "0"}, {"--seq"}},
      {"fractional size", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "1.5"}, {"--seq"}},
      {"zero tp", est({"--tp", "0"}), {"--tp"}},
      {"list given to estimate", est({"--tp", "1,2"}), {"--tp"}},
      {"bad precision", est({"--precision", "fp4"}), {"fp4"}},
      {"bad recompute", est({"--recompute", "partial"}), {"partial"}},
      {"bad routing imbalance", est({"--routing-imbalance", "lots"}), {"lots"}},
      {"routing imbalance below 1", est({"--routing-imbalance", "0.5"}), {"routing_imbalance"}},
      {"unknown recompute module", est({"--recompute", "selective", "--recompute-modules", "core_attn,attention"}),
       {"\"attention\"", "core_attn, layernorm"}},
      {"dispatcher the framework lacks", est({"--ep", "8", "--dispatcher", "deepep", "--implementation", "lcplan-exec"}),
       {"deepep", "lcplan-exec", "megatron"}},
      {"CUDA graphs with layer offloading", est({"--cuda-graphs", "transformer_engine", "--offload-activations", "--ep", "8",
                                                  "--capacity-factor", "1", "--pad-to-capacity", "on"}),
       {"cuda_graphs", "offload.activations"}},
      {"CUDA graphs capturing a dropless MoE layer", est({"--cuda-graphs", "full_iteration"}), {"full_iteration", "dropless"}},
      {"unknown CUDA graph module", est({"--cuda-graphs", "local", "--cuda-graph-modules", "router"}), {"\"router\"", "moe_router"}},
      {"switch neither on nor off", est({"--dp-overlap", "maybe"}), {"--dp-overlap", "maybe", "on, off"}},
      {"unknown model", {"estimate", "--model", "qwen3.5", "--gpus", "32", "--seq", "128k"}, {"qwen3.5", "qwen3.5-35b-a3b"}},
      {"unknown hardware", est({"--hardware", "h1000"}), {"h1000"}},
      {"hardware name too long for a file name", est({"--hardware", std::string(300, 'h')}), {"hardware", "too long"}},
      {"calibration name too long for a file name", est({"--calibration", std::string(300, 'm')}),
       {"calibration", "too long"}},
      {"unknown implementation", est({"--implementation", "deepspeed"}), {"deepspeed"}},
      {"malformed config.json", {"estimate", "--model", path("bad_config.json"), "--gpus", "8", "--seq", "4k"}, {"hidden_size"}},
      {"config.json with no layers", {"estimate", "--model", path("no_layers.json"), "--gpus", "8", "--seq", "4k"},
       {"num_hidden_layers", "positive", "got 0"}},
      {"plan file with seq_len 0", {"estimate", "--plan", path("seq0.json")}, {"seq0.json", "seq_len", "131072"}},
      {"search --out-plan past the top", srch({"--out", path("never.json"), "--out-plan", "99"}), {"--out-plan 99", "reduced"}},
      {"search --out of a launch without --model",
       {"search", "--megatron-args",
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
        "--vocab-size 32000 --seq-length 4096 --bf16", "--out", path("never.json")},
       {"--out", "--model", "shape flags"}},
      {"tune of a launch without --model",
       {"tune", "--megatron-args",
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
        "--vocab-size 32000 --seq-length 4096 --bf16", "--launcher", "x {plan}", "--run-dir", path("never-runs")},
       {"tune", "--model"}},
      {"validate of a scaled run against its full plan", {"validate", "--measurements", path("scaled_run.json")},
       {"cpu-scaled", "scaled down", "--scale 64", "validate --measured"}},
      {"report drawing a scaled run beside its full plan",
       {"report", "--plan", path("plan_ok.json"), "--measured", path("scaled_run.json"), "--out", path("r.html")},
       {"cpu-scaled", "scaled down"}},
      {"calibrate from a scaled run", {"calibrate", "--measurements", path("scaled_run.json"), "--out", path("never.json")},
       {"cpu-scaled", "scaled down"}},
      {"search over too many GPUs", srch({"--gpus", "10000000"}), {"gpus = 10000000", "valid: 1 to 1048576"}},
      {"megatron args with an unclosed quote", est({"--megatron-args", "--seq-length 4096 --tensor-model-parallel-size 'abc"}),
       {"--megatron-args", "quote"}},
      {"config that is not JSON", {"estimate", "--model", path("not_json.json"), "--gpus", "8", "--seq", "4k"}, {"not_json.json"}},
      {"tp not dividing heads", est({"--tp", "3", "--gpus", "48"}), {"tp"}},
      {"ep not dividing experts", est({"--ep", "3", "--gpus", "48"}), {"ep", "experts"}},
      {"gpus not divisible by tp*pp*cp", est({"--gpus", "30", "--cp", "4"}), {"tp*pp*cp"}},
      {"layers not split by pp", est({"--pp", "16", "--vpp", "4", "--gpus", "64"}), {"layers"}},
      {"recompute layers without full recompute", est({"--recompute-layers", "2"}), {"recompute"}},
      {"ep chunks out of range", est({"--ep-chunks", "5", "--ep", "8"}), {"ep_chunks"}},
      {"--fsdp with --dist-opt", est({"--fsdp", "--dist-opt"}), {"--dist-opt", "fsdp"}},
      {"--fsdp with --optimizer-sharding none", est({"--fsdp", "--optimizer-sharding", "none"}), {"--fsdp"}},
      {"--linear-ce with --no-linear-ce", est({"--linear-ce", "--no-linear-ce"}), {"--linear-ce", "--no-linear-ce"}},
      {"search: --tp 3 for a 16-head model", srch({"--tp", "3"}), {"--tp", "3"}},
      {"search: --fsdp with --dist-opt", srch({"--fsdp", "--dist-opt"}), {"--dist-opt", "fsdp"}},
      {"search: bad objective", srch({"--objective", "speed"}), {"speed"}},
      {"search: negative headroom", srch({"--headroom", "-1"}), {"--headroom"}},
      {"search: headroom above the GPU's memory", srch({"--headroom", "200"}), {"--headroom", "200", "h100"}},
      {"search: --top not a number", srch({"--top", "abc"}), {"--top", "abc", "whole number"}},
      {"search: --top zero", srch({"--top", "0"}), {"--top", "1 to 1000"}},
      {"search: negative throughput floor", srch({"--objective", "memory", "--throughput-floor", "-5"}),
       {"--throughput-floor", "-5"}},
      {"search: throughput floor without the memory objective", srch({"--throughput-floor", "100"}),
       {"--throughput-floor", "--objective memory"}},
      {"search: --out empty", srch({"--out", ""}), {"--out", "empty"}},
      {"search: empty list entry", srch({"--tp", "1,,2"}), {"--tp", "1,,2"}},
      {"search: nothing fits", {"search", "--model", "deepseek-v3", "--gpus", "8", "--seq", "1M"}, {"fits"}},
      {"plan file missing", {"estimate", "--plan", path("no_such_plan.json")}, {"no_such_plan.json"}},
      {"plan file unreadable", {"estimate", "--plan", path("unreadable.json")}, {"unreadable.json", "permission"}, true},
      {"plan file of binary junk", {"estimate", "--plan", path("junk.json")}, {"junk.json"}},
      {"plan file is /dev/zero", {"estimate", "--plan", "/dev/zero"}, {"/dev/zero", "device"}},
      {"plan file is a FIFO", {"estimate", "--plan", path("pipe.json")}, {"pipe.json", "FIFO"}},
      {"model config is /dev/urandom", {"estimate", "--model", "/dev/urandom", "--gpus", "8", "--seq", "4k"},
       {"/dev/urandom", "device"}},
      {"hardware file is a directory", est({"--hardware", path("a_directory.json")}), {"a_directory.json", "directory"}},
      {"calibration profile path is a directory", est({"--implementation", path("a_directory.json")}),
       {"a_directory.json", "directory"}},
      {"plan file is a directory", {"estimate", "--plan", path("a_directory.json")}, {"a_directory.json", "directory"}},
      {"plan file with unknown key", {"estimate", "--plan", path("bad_plan.json")}, {"tensor_parallel"}},
      {"config path is a directory", {"estimate", "--model", path("a_directory.json"), "--gpus", "8", "--seq", "4k"}, {"directory"}},
      {"calibration file missing", est({"--calibration", path("no_such_calibration.json")}), {"no_such_calibration.json"}},
      {"--out into a missing directory", est({"--out", path("missing_dir/estimate.json")}), {"missing_dir"}},
      {"--out is a directory", est({"--out", path("a_directory.json")}), {"a_directory.json"}},
      {"--out is empty", est({"--out", ""}), {"--out", "empty"}},
      {"--out= is empty", est({"--out="}), {"--out", "empty"}},
      {"--out is a FIFO", est({"--out", path("pipe.json")}), {"pipe.json", "FIFO"}},
      {"search --out into a missing directory", srch({"--out", path("missing_dir/recipe.json")}), {"missing_dir"}},
      {"report without --out", rep({}), {"--out"}},
      {"report: a search flag without --search", rep({"--headroom", "2", "--out", path("r.html")}), {"--headroom", "--search"}},
      {"report: a list without --search", rep({"--tp", "1,2", "--out", path("r.html")}), {"--tp", "--search"}},
      {"report: --out into a missing directory", rep({"--out", path("missing_dir/r.html")}), {"missing_dir"}},
      {"report: --out is a directory", rep({"--out", path("a_directory.json")}), {"a_directory.json"}},
      {"report: measured runs of another plan", rep({"--measured", path("other_plan_runs.json"), "--out", path("r.html")}),
       {"other_plan_runs.json", "plan"}},
      {"report: measurements file missing", rep({"--measured", path("no_such_runs.json"), "--out", path("r.html")}),
       {"no_such_runs.json"}},
      {"report --search: nothing fits",
       {"report", "--search", "--model", "deepseek-v3", "--gpus", "8", "--seq", "1M", "--out", path("r.html")}, {"fits"}},
      {"megatron args: a contradiction", est({"--megatron-args", "--fp8-format hybrid --fp4-format e2m1"}), {"--fp8-format", "--fp4-format"}},
      {"megatron args with --plan", {"estimate", "--plan", path("plan_ok.json"), "--megatron-args", "--seq-length 4096 --bf16"},
       {"--plan", "--megatron-args"}},
      {"megatron args with a args file", est({"--megatron-args", "--bf16 --seq-length 4096", "--megatron-args-file", path("unclosed.sh")}),
       {"--megatron-args", "--megatron-args-file"}},
      {"megatron args without a GPU count", {"estimate", "--model", "qwen3-30b-a3b", "--megatron-args", "--seq-length 4096 --bf16"},
       {"GPU count", "--gpus"}},
      {"megatron args without a model", {"estimate", "--gpus", "8", "--megatron-args", "--num-layers 4 --seq-length 4096"},
       {"--model", "--hidden-size"}},
      {"megatron args with an unset variable", {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--megatron-args", "--seq-length $SEQ --bf16"},
       {"--seq-length", "$SEQ"}},
      {"megatron layers disagree with --model", {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--megatron-args", "--num-layers 40 --bf16"},
       {"--num-layers 40", "48"}},
      {"megatron args plan breaks a rule", {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--megatron-args", "--seq-length 4096 --tensor-model-parallel-size 3 --bf16"},
       {"tp"}},
      {"megatron args file missing", {"estimate", "--model", "qwen3-30b-a3b", "--megatron-args-file", path("no_such_run.sh")}, {"no_such_run.sh"}},
      {"megatron script with an unclosed quote", {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--megatron-args-file", path("unclosed.sh")},
       {"unclosed.sh", "line 1", "quote"}},
      {"search: megatron args without a model", {"search", "--gpus", "8", "--megatron-args", "--seq-length 4096 --bf16"}, {"--model"}},
      {"ingest without a source", {"ingest"}, {"ingest", "megatron"}},
      {"ingest with an unknown source", {"ingest", "nemo"}, {"nemo", "megatron"}},
      {"ingest megatron without logs", {"ingest", "megatron", "--plan", path("plan_ok.json"), "--out", path("runs.json")}, {"logs"}},
      {"ingest megatron without --plan", {"ingest", "megatron", path("good.log"), "--out", path("runs.json")}, {"--plan"}},
      {"ingest megatron log of another layout",
       {"ingest", "megatron", path("tp2.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json")},
       {"tp2.log", "reports tp 2", "plan's tp is 1"}},
      {"ingest megatron without --out", {"ingest", "megatron", path("good.log"), "--plan", path("plan_ok.json")}, {"--out"}},
      {"ingest megatron log missing", {"ingest", "megatron", path("no_such.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json")},
       {"no_such.log"}},
      {"ingest megatron log without iteration lines",
       {"ingest", "megatron", path("no_iterations.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json")},
       {"no_iterations.log", "no iteration lines"}},
      {"ingest megatron crashed run", {"ingest", "megatron", path("crash.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json")},
       {"crash.log", "failed before its first logged iteration", "ValueError: bad value"}},
      {"ingest megatron global batch other than the plan's",
       {"ingest", "megatron", path("gb128.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json")},
       {"global batch size 128", "global_batch 64"}},
      {"ingest megatron every iteration skipped",
       {"ingest", "megatron", path("good.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json"), "--skip-iterations", "5"},
       {"--skip-iterations 5", "0 to 1"}},
      {"ingest megatron --skip-iterations not a number",
       {"ingest", "megatron", path("good.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json"), "--skip-iterations", "x"},
       {"--skip-iterations", "\"x\""}},
      {"ingest megatron plan file invalid", {"ingest", "megatron", path("good.log"), "--plan", path("bad_plan.json"), "--out", path("runs.json")},
       {"tensor_parallel"}},
      {"ingest megatron --out into a missing directory",
       {"ingest", "megatron", path("good.log"), "--plan", path("plan_ok.json"), "--out", path("missing_dir/runs.json")}, {"missing_dir"}},
      {"ingest megatron unknown flag", {"ingest", "megatron", path("good.log"), "--plan", path("plan_ok.json"), "--out", path("runs.json"), "--rank", "0"},
       {"--rank", "ingest megatron"}},
      {"estimate --seq-lengths with a negative length",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--ep", "8", "--cp", "4", "--seq-lengths",
        path("lengths_negative.txt"), "--out", path("never.json")},
       {"lengths_negative.txt", "-3"}},
      {"estimate --seq-lengths with a fractional length",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq-lengths", path("lengths_fraction.json")},
       {"1.5"}},
      {"estimate --seq-lengths empty", {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq-lengths",
                                        path("lengths_empty.txt")}, {"empty"}},
      {"estimate --seq-lengths beyond the model's positions",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq-lengths", path("lengths_too_long.txt")},
       {"300000", "max_position_embeddings"}},
      {"estimate --seq-lengths with a budget below a sequence at cp 1",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--ep", "8", "--seq-lengths", path("lengths_ok.txt"),
        "--tokens-per-microbatch", "16k", "--out", path("never.json")},
       {"65536", "--tokens-per-microbatch 16384"}},
      {"estimate --seq-lengths and --seq", est({"--seq-lengths", path("lengths_ok.txt")}), {"--seq", "--seq-lengths"}},
      {"estimate --tokens-per-microbatch without --seq-lengths", est({"--tokens-per-microbatch", "16k"}),
       {"--seq-lengths"}},
      {"estimate --packing of an unknown policy",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--ep", "8", "--seq-lengths", path("lengths_ok.txt"),
        "--tokens-per-microbatch", "64k", "--packing", "greedy"},
       {"--packing", "greedy", "first_fit, balanced"}},
      {"estimate --packing balanced without a budget",
       {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--ep", "8", "--seq-lengths", path("lengths_ok.txt"),
        "--packing", "balanced"},
       {"--packing balanced", "--tokens-per-microbatch"}},
      {"calibrate without measurements", {"calibrate", "--out", path("calib.json")}, {"--measurements"}},
      {"calibrate with a missing measurements file",
       {"calibrate", "--measurements", path("no_such_runs.json"), "--out", path("calib.json")}, {"no_such_runs.json"}},
      {"calibrate with an empty measurements file",
       {"calibrate", "--measurements", path("empty_measurements.json"), "--out", path("calib.json")}, {"measurements"}},
      {"calibrate with a directory as measurements",
       {"calibrate", "--measurements", path("a_directory.json"), "--out", path("calib.json")}, {"a_directory.json", "directory"}},
      {"calibrate with --huber out of range",
       {"calibrate", "--measurements", path("empty_measurements.json"), "--out", path("calib.json"), "--huber", "2"},
       {"--huber", "0 to 1"}},
      {"calibrate --out into a missing directory",
       {"calibrate", "--measurements", std::string(LCPLAN_SOURCE_DIR) + "/data/validation/bumblebee-runs.json", "--out",
        path("missing_dir/calib.json"), "--no-loo", "--fit", "memory.fragmentation"},
       {"missing_dir"}},
  };
}

void PrintTo(const Bad& b, std::ostream* os) { *os << show(b.args); }

class BadInvocation : public ::testing::TestWithParam<Bad> {};

TEST_P(BadInvocation, FailsWithOneSentenceAndNoResult) {
  const Bad& b = GetParam();
  const std::string cmd = show(b.args);
  if (b.as_nobody && ::geteuid() == 0 && !nobody_can_run_lcplan())
    GTEST_SKIP() << "running as root and user nobody cannot run " << LCPLAN_BINARY
                 << " or read the data folder, so a file root can read cannot be made unreadable";
  const Outcome r = run_lcplan(b.args, b.as_nobody);
  ASSERT_NE(r.status, 125) << cmd << ": could not drop root privileges to user nobody";
  EXPECT_NE(r.status, 0) << cmd << ": exit code 0";
  EXPECT_LT(r.status, 128) << cmd << ": killed by a signal (crash)";
  EXPECT_NE(r.status, 3) << cmd << ": reported as an internal error";
  EXPECT_TRUE(r.out.empty()) << cmd << ": printed on stdout:\n" << r.out.substr(0, 2000);
  expect_one_sentence(r.err, cmd);
  for (const auto& word : b.mentions) EXPECT_NE(r.err.find(word), std::string::npos) << cmd << ": stderr does not mention \"" << word << "\": " << r.err;
  EXPECT_FALSE(fs::exists(scratch() / "missing_dir")) << cmd << ": created the missing directory";
  EXPECT_FALSE(fs::exists(scratch() / "r.html")) << cmd << ": wrote a report";
  EXPECT_FALSE(fs::exists(scratch() / "never.json")) << cmd << ": wrote a recipe";
  EXPECT_FALSE(fs::exists(scratch() / "never-runs")) << cmd << ": made a tune's run folder";
  // No leftover temporary file next to an output that failed.
  for (const auto& e : fs::directory_iterator(scratch()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << cmd << ": left " << e.path();
}

INSTANTIATE_TEST_SUITE_P(Table, BadInvocation, ::testing::ValuesIn(bad_invocations()), [](const auto& info) {
  std::string s = std::to_string(info.index) + "_" + info.param.what;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

TEST(GoodInvocation, EstimateReferencePlan) {
  const std::vector<std::string> args = {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k",
                                         "--ep", "8", "--cp", "4", "--fsdp", "--recompute", "full", "--linear-ce",
                                         "--ep-chunks", "2", "--implementation", "bumblebee"};
  const Outcome r = run_lcplan(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("GiB"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

// A plan that does not fit names the command that finds one that does; one that fits does not.
TEST(GoodInvocation, EstimateOfAPlanThatDoesNotFitPointsToSearch) {
  const Outcome big = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k"});
  ASSERT_EQ(big.status, 0) << big.err;
  EXPECT_NE(big.out.find("DOES NOT FIT"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("hint: lcplan search"), std::string::npos) << big.out;
  const Outcome fits = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--ep",
                                   "8", "--cp", "4", "--fsdp", "--recompute", "full", "--linear-ce"});
  ASSERT_EQ(fits.status, 0) << fits.err;
  EXPECT_EQ(fits.out.find("hint: lcplan search"), std::string::npos) << fits.out;
}

// The error band measures a new model on a framework whose other models the fit saw (data/calibration/default.json
// validation.time.frameworks): an lcplan-exec plan on H100 and a bumblebee search say the band is not their own; a
// Megatron plan does not.
TEST(GoodInvocation, EstimateSaysWhenItsFrameworkIsNotInTheFit) {
  const std::vector<std::string> plan = {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4k", "--ep", "8"};
  std::vector<std::string> exec = plan;
  exec.insert(exec.end(), {"--implementation", "lcplan-exec"});
  const Outcome outside = run_lcplan(exec);
  ASSERT_EQ(outside.status, 0) << outside.err;
  EXPECT_NE(outside.out.find("note: the error band measures new models on megatron, not on lcplan-exec"), std::string::npos)
      << outside.out;
  const Outcome inside = run_lcplan(plan);
  ASSERT_EQ(inside.status, 0) << inside.err;
  EXPECT_EQ(inside.out.find("note: the error band"), std::string::npos) << inside.out;
  // A search of the article's framework says the same under its table.
  const Outcome search = run_lcplan({"search", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4k",
                                     "--implementation", "bumblebee"});
  ASSERT_EQ(search.status, 0) << search.err;
  EXPECT_NE(search.out.find("note: the error band measures new models on megatron, not on bumblebee"), std::string::npos)
      << search.out;
}

// A run-setting flag given to lcplan beats the launch it starts from and is not a default any more: selective recompute
// with Megatron's default modules, then --recompute-modules and --grad-dtype from the flag rows.
TEST(GoodInvocation, RunSettingFlagOverridesAMegatronLaunch) {
  const Outcome r = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "8", "--seq", "8k", "--megatron-args",
                                "--bf16 --tensor-model-parallel-size 2 --sequence-parallel --recompute-granularity selective",
                                "--recompute-modules", "moe_act,layernorm", "--grad-dtype", "bf16", "--precision-aware-optimizer",
                                "on", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto plan = nlohmann::json::parse(r.out).at("plan");
  EXPECT_EQ(plan.at("recompute_modules"), nlohmann::json({"layernorm", "moe_act"}));
  EXPECT_EQ(plan.at("optimizer").at("grad_dtype"), "bf16");
  EXPECT_EQ(plan.at("optimizer").at("precision_aware"), true);
}

// An on/off switch given bare is on; given a value, that value.
TEST(GoodInvocation, ASwitchGivenBareIsOn) {
  const Outcome r = run_lcplan({"estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4k", "--ep", "8",
                                "--capacity-factor", "1", "--pad-to-capacity", "--permute-fusion", "off", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto moe = nlohmann::json::parse(r.out).at("plan").at("moe");
  EXPECT_EQ(moe.at("pad_to_capacity"), true);
  EXPECT_EQ(moe.at("permute_fusion"), false);
}

// Variable-length batches: the fullest microbatch's table, then the batches' peak percentiles and straggler.
TEST(GoodInvocation, EstimateOverSequenceLengths) {
  const fs::path lengths = scratch() / "lengths_good.txt";
  std::ofstream(lengths) << "4096\n4096\n4096\n65536\n";
  const Outcome r = run_lcplan({"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--ep", "8", "--cp", "4",
                                "--fsdp", "--recompute", "full", "--seq-lengths", lengths.string(),
                                "--tokens-per-microbatch", "32k", "--global-tokens", "4M", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("batches").at("peak_bytes").at("max").get<double>(), 0);
  EXPECT_GE(j.at("batches").at("straggler_share").get<double>(), 0);
  EXPECT_EQ(j.at("batches").at("tokens_per_microbatch").at("max").get<double>(), 131072);
}

// A search over batches writes its best plan with its batches; estimating that recipe gives the search's numbers.
TEST(GoodInvocation, SearchOverSequenceLengthsWritesARecipeThatEstimatesTheSame) {
  const fs::path lengths = scratch() / "lengths_search.json", recipe = scratch() / "batches_recipe.json";
  std::ofstream(lengths) << "[[4096, 6], [32768, 3], [131072, 1]]";
  const Outcome s = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--implementation", "bumblebee",
                                "--seq-lengths", lengths.string(), "--global-tokens", "4M", "--samples", "4", "--json",
                                "--out", recipe.string()});
  ASSERT_EQ(s.status, 0) << s.err;
  const auto searched = nlohmann::json::parse(s.out);
  const Outcome e = run_lcplan({"estimate", "--plan", recipe.string(), "--json"});
  ASSERT_EQ(e.status, 0) << e.err;
  const auto estimated = nlohmann::json::parse(e.out);
  EXPECT_DOUBLE_EQ(estimated.at("batches").at("tokens_per_second_per_gpu").get<double>(),
                   searched.at("top").at(0).at("batches").at("tokens_per_second_per_gpu").get<double>());
  EXPECT_EQ(estimated.at("batches").at("plan"), searched.at("top").at(0).at("plan"));
}

// report --search --seq-lengths: the page of the same search, its best plan's expected tokens/s as search printed it.
// A search over batches emits Megatron-LM flags for its best plan with the batches' comment line, and --out-plan
// reduced writes the reduced recipe with its batches, which estimate then reproduces.
TEST(GoodInvocation, SearchOverSequenceLengthsEmitsAndWritesTheReducedRecipe) {
  const fs::path lengths = scratch() / "lengths_emit.json", recipe = scratch() / "batches_reduced.json";
  std::ofstream(lengths) << "[[4096, 6], [32768, 3], [131072, 1]]";
  const Outcome s = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--implementation", "bumblebee",
                                "--seq-lengths", lengths.string(), "--samples", "4", "--emit", "megatron", "--out",
                                recipe.string(), "--out-plan", "reduced"});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_NE(s.out.find("reduced recipe over the batches"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("--context-parallel-size"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("# batches: "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("ppo_max_token_len_per_gpu"), std::string::npos) << s.out;
  const Outcome e = run_lcplan({"estimate", "--plan", recipe.string(), "--json"});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(nlohmann::json::parse(e.out).contains("batches"));
  const auto j = nlohmann::json::parse(slurp(recipe.string()));
  EXPECT_EQ(j.at("batches").at("tokens_per_microbatch"), 32768);
  EXPECT_EQ(j.at("parallel").value("tp", 1), 1);  // the rules' TP
  const Outcome bad = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq-lengths",
                                  lengths.string(), "--out", (scratch() / "never.json").string(), "--out-plan", "99"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_FALSE(fs::exists(scratch() / "never.json"));
}

TEST(GoodInvocation, ReportOfASearchOverSequenceLengths) {
  const fs::path lengths = scratch() / "lengths_report.json", page = scratch() / "batches_search.html";
  std::ofstream(lengths) << "[[4096, 6], [32768, 3], [131072, 1]]";
  const std::vector<std::string> flags = {"--model", "qwen3.5-35b-a3b", "--gpus", "32", "--implementation", "bumblebee",
                                          "--seq-lengths", lengths.string(), "--global-tokens", "4M", "--samples", "4"};
  std::vector<std::string> search = {"search", "--json"}, report = {"report", "--search", "--out", page.string()};
  search.insert(search.end(), flags.begin(), flags.end());
  report.insert(report.end(), flags.begin(), flags.end());
  const Outcome s = run_lcplan(search);
  ASSERT_EQ(s.status, 0) << s.err;
  const Outcome r = run_lcplan(report);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(page);
  EXPECT_NE(html.find("Best plans over the drawn batches"), std::string::npos);
  char best[32];
  std::snprintf(best, sizeof best, "%.0f",
                nlohmann::json::parse(s.out).at("top").at(0).at("batches").at("tokens_per_second_per_gpu").get<double>());
  EXPECT_NE(html.find(best), std::string::npos) << best;
}

TEST(GoodInvocation, EstimateJsonOutIsTheRecord) {
  const fs::path out = scratch() / "estimate.json";
  std::vector<std::string> args = ref({"--ep", "8", "--cp", "4", "--json", "--out", out.string()});
  args.insert(args.begin(), "estimate");
  const Outcome r = run_lcplan(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(out), r.out) << "--out holds a different record than --json printed";
  EXPECT_NE(r.out.find("\"peak_bytes\""), std::string::npos);
}

// The recipe search writes is the plan of its top row: estimating it gives that row's numbers bit for bit.
TEST(GoodInvocation, SearchTopRowIsReproducedByEstimateOfItsRecipe) {
  const std::vector<std::vector<std::string>> searches = {
      {"--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k"},
      {"--model", "llama-3.1-70b", "--gpus", "64", "--seq", "64k", "--hardware", "h200", "--implementation", "bumblebee"},
      {"--model", "deepseek-v3", "--gpus", "256", "--seq", "32k", "--objective", "memory", "--throughput-floor", "100"},
  };
  for (const auto& flags : searches) {
    const fs::path recipe = scratch() / "top_recipe.json";
    std::vector<std::string> args = {"search", "--json", "--top", "3", "--out", recipe.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    const Outcome s = run_lcplan(args);
    ASSERT_EQ(s.status, 0) << show(args) << ": " << s.err;
    const auto searched = nlohmann::json::parse(s.out);
    ASSERT_FALSE(searched["top"].empty()) << show(args);
    const auto& top = searched["top"][0];
    const Outcome e = run_lcplan({"estimate", "--plan", recipe.string(), "--json"});
    ASSERT_EQ(e.status, 0) << e.err;
    const auto estimated = nlohmann::json::parse(e.out);
    EXPECT_EQ(estimated["plan"], top["plan"]) << show(args);
    // Exact comparison: both are the same computation on the same plan, printed with round-trip precision.
    EXPECT_EQ(estimated["memory"]["peak_bytes"].get<double>(), top["memory"]["peak_bytes"].get<double>()) << show(args);
    EXPECT_EQ(estimated["time"]["step_seconds"].get<double>(), top["time"]["step_seconds"].get<double>()) << show(args);
    EXPECT_EQ(estimated["time"]["tokens_per_second_per_gpu"].get<double>(),
              top["time"]["tokens_per_second_per_gpu"].get<double>()) << show(args);
    EXPECT_EQ(estimated["memory"], top["memory"]) << show(args) << ": per-stage memory differs";
  }
}

TEST(GoodInvocation, Models) {
  const Outcome r = run_lcplan({"models"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("qwen3.5-35b-a3b"), std::string::npos);
  EXPECT_NE(r.out.find("llama-3.1-405b"), std::string::npos);
}

// A run that ran out of memory is checked against the predicted peak, not set aside as "not modelled" (issue 28,
// item 8): the reference model at 128K on 8 GPUs without any sharding or recompute cannot fit, as estimated.
TEST(GoodInvocation, ValidateComparesAnOutOfMemoryRunWithThePredictedFit) {
  const fs::path runs = scratch() / "oom-runs.json";
  std::ofstream(runs) << R"([{"id": "oom-1", "plan": {"model": "qwen3.5-35b-a3b", "gpus": 8, "seq_len": 131072,
    "parallel": {"ep": 8}}, "status": "out_of_memory", "failure": "CUDA out of memory"}])";
  const Outcome r = run_lcplan({"validate", "--measurements", runs.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("oom-1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ran out of memory; predicted peak"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("as predicted"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not modelled"), std::string::npos) << r.out;
}

// Missing basics (issue 28 item 10): what lcplan read of a config.json, the N-th plan or the reduced recipe as a
// recipe, and the hardware help listing every shipped profile.
TEST(GoodInvocation, ModelsShowsWhatItRead) {
  const Outcome r = run_lcplan({"models", "--show", "qwen3.5-35b-a3b"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("40 layers (10 x (3 x gdn+moe, attn+moe)) + 1 MTP"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts 256"), std::string::npos) << r.out;
  const Outcome j = run_lcplan({"models", "--show", std::string(LCPLAN_SOURCE_DIR) + "/models/zoo/deepseek-v3.json", "--json"});
  ASSERT_EQ(j.status, 0) << j.err;
  const nlohmann::json d = nlohmann::json::parse(j.out);
  EXPECT_EQ(d.at("mla").at("kv_lora_rank"), 512);
  EXPECT_EQ(d.at("moe").at("top_k"), 8);
  EXPECT_GT(d.at("params").at("total").get<double>(), 6.7e11);
}

TEST(GoodInvocation, SearchWritesTheNthPlanOrTheReducedRecipe) {
  const std::vector<std::string> s = {"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--json"};
  const Outcome all = run_lcplan(s);
  ASSERT_EQ(all.status, 0) << all.err;
  const nlohmann::json rec = nlohmann::json::parse(all.out);
  const fs::path third = scratch() / "third.json", reduced = scratch() / "reduced.json";
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = s;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  ASSERT_EQ(run_lcplan(with({"--out", third.string(), "--out-plan", "3"})).status, 0);
  ASSERT_EQ(run_lcplan(with({"--out", reduced.string(), "--out-plan", "reduced"})).status, 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(third)).at("parallel"), rec.at("top").at(2).at("plan").at("parallel"));
  EXPECT_EQ(nlohmann::json::parse(slurp(reduced)).at("parallel"), rec.at("reduced_recipe").at("estimate").at("plan").at("parallel"));
}

// Recipes travel (issue 28 item 5): a config.json path is stored relative to the recipe, so estimate --plan works
// from another directory.
TEST(GoodInvocation, ARecipeWithAConfigPathWorksFromAnywhere) {
  const fs::path work = scratch() / "travel" / "work", out = scratch() / "travel" / "out";
  fs::create_directories(work / "cfg");
  fs::create_directories(out);
  fs::copy_file(std::string(LCPLAN_SOURCE_DIR) + "/models/zoo/qwen3-30b-a3b.json", work / "cfg" / "model.json",
                fs::copy_options::overwrite_existing);
  lcplan::testing::RunOptions in_work;
  in_work.cwd = work.string();
  const Outcome s = lcplan::testing::run_program({LCPLAN_BINARY, "search", "--model", "cfg/model.json", "--gpus", "16",
                                                  "--seq", "4k", "--out", "../out/recipe.json"}, in_work);
  ASSERT_EQ(s.status, 0) << s.err;
  const nlohmann::json recipe = nlohmann::json::parse(slurp(out / "recipe.json"));
  EXPECT_EQ(recipe.at("model"), "../work/cfg/model.json");
  lcplan::testing::RunOptions elsewhere;
  elsewhere.cwd = "/";
  const Outcome e = lcplan::testing::run_program({LCPLAN_BINARY, "estimate", "--plan", (out / "recipe.json").string()}, elsewhere);
  EXPECT_EQ(e.status, 0) << e.err;
}

TEST(GoodInvocation, VersionNamesTheCommit) {
  const Outcome r = run_lcplan({"--version"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("lcplan ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("(commit "), std::string::npos) << r.out;
}

// lcplan diff: two plans term by term (only what differs), and a plan against a measured record.
TEST(GoodInvocation, DiffShowsWhatDiffersBetweenTwoPlans) {
  const fs::path a = scratch() / "diff-a.json", b = scratch() / "diff-b.json";
  std::ofstream(a) << R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": "128k", "parallel": {"ep": 8, "cp": 4},
    "optimizer_sharding": "fsdp", "recompute": "full", "linear_ce": true})";
  std::ofstream(b) << R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": "128k", "parallel": {"ep": 8, "cp": 4},
    "optimizer_sharding": "dist_opt", "recompute": "full", "linear_ce": true})";
  const Outcome r = run_lcplan({"diff", a.string(), b.string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  std::set<std::string> fields;
  for (const auto& row : rows) fields.insert(row.at("field").get<std::string>());
  EXPECT_TRUE(fields.count("plan.optimizer_sharding")) << r.out;
  EXPECT_TRUE(fields.count("memory.stages.0.breakdown.params")) << r.out;  // FSDP shards the weights too
  EXPECT_FALSE(fields.count("plan.model")) << "an equal field is listed";
  const Outcome same = run_lcplan({"diff", a.string(), a.string()});
  ASSERT_EQ(same.status, 0) << same.err;
  EXPECT_NE(same.out.find("identical"), std::string::npos) << same.out;
}

// One default global batch (issue 28 item 7): the search's top plan, estimated with the same flags and no
// --global-batch, prints the same throughput, and both outputs open with the same header of what they assumed.
TEST(GoodInvocation, EstimateAndSearchAssumeTheSameBatchAndSayWhichInTheirHeader) {
  const Outcome s = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--json"});
  ASSERT_EQ(s.status, 0) << s.err;
  const nlohmann::json top = nlohmann::json::parse(s.out).at("top").at(0);
  const nlohmann::json& p = top.at("plan");
  std::vector<std::string> est = {"estimate", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--json"};
  for (const char* k : {"tp", "pp", "vpp", "cp", "ep", "etp"})
    est.insert(est.end(), {std::string("--") + k, std::to_string(p.at("parallel").at(k).get<int>())});
  est.insert(est.end(), {"--ep-chunks", std::to_string(p.at("moe").at("ep_chunks").get<int>()), "--recompute",
                         p.at("recompute").get<std::string>(), "--optimizer-sharding", p.at("optimizer_sharding").get<std::string>(),
                         p.at("linear_ce").get<bool>() ? "--linear-ce" : "--no-linear-ce"});
  // The performance switches a search sets where the plan leaves them (README "Frameworks"), as the plan states them.
  const auto on_off = [](const nlohmann::json& v) { return std::string(v.get<bool>() ? "on" : "off"); };
  est.insert(est.end(), {"--dp-overlap", on_off(p.at("comm").at("overlap_grad_reduce")), "--tp-overlap",
                         on_off(p.at("comm").at("tp_overlap")), "--permute-fusion", on_off(p.at("moe").at("permute_fusion"))});
  if (p.at("moe").value("a2a_overlap", false)) est.push_back("--a2a-overlap");
  if (p.at("offload").at("optimizer").get<bool>()) est.push_back("--offload-optimizer");
  const Outcome e = run_lcplan(est);
  ASSERT_EQ(e.status, 0) << e.err;
  const nlohmann::json rec = nlohmann::json::parse(e.out);
  EXPECT_EQ(rec.at("plan").at("global_batch"), p.at("global_batch"));
  EXPECT_NEAR(rec.at("time").at("tflops_per_gpu").get<double>(), top.at("time").at("tflops_per_gpu").get<double>(), 1e-9);
  const std::string header = "qwen3.5-35b-a3b on 32 x h100-sxm-80gb, seq 131072, global batch 32 (the default: one sequence per GPU)";
  est.erase(std::find(est.begin(), est.end(), "--json"));  // the table
  const Outcome et = run_lcplan(est);
  const Outcome st = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k"});
  EXPECT_EQ(et.out.rfind(header, 0), 0u) << et.out.substr(0, 300);
  EXPECT_EQ(st.out.rfind(header, 0), 0u) << st.out.substr(0, 300);
}

// The Pareto table (issue 28 item 6): the chosen plan marked, both ends shown, how many left out said.
TEST(GoodInvocation, ParetoTableShowsBothEndsAndTheChosenPlan) {
  const Outcome r = run_lcplan({"search", "--model", "deepseek-v3", "--gpus", "1024", "--seq", "4k", "--tp", "1,2", "--ep", "64"});
  ASSERT_EQ(r.status, 0) << r.err;
  const size_t at = r.out.find("Pareto front");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string front = r.out.substr(at, r.out.find("reduced recipe", at) - at);
  EXPECT_NE(front.find("\n*"), std::string::npos) << "the chosen plan is not marked:\n" << front;
  EXPECT_NE(front.find("\n   1 "), std::string::npos) << "the low-memory end is missing:\n" << front;
  EXPECT_NE(front.find("front plans shown: both ends"), std::string::npos) << front;
  const Outcome m = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--objective", "memory"});
  ASSERT_EQ(m.status, 0) << m.err;
  EXPECT_NE(m.out.find("best plans by peak memory, lowest first"), std::string::npos) << m.out.substr(0, 600);
}

TEST(GoodInvocation, HardwareHelpListsEveryShippedProfile) {
  const Outcome r = run_lcplan({"estimate", "--help"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const auto& e : fs::directory_iterator(std::string(LCPLAN_SOURCE_DIR) + "/data/hardware"))
    EXPECT_NE(r.out.find(e.path().stem().string()), std::string::npos) << e.path().stem() << " missing from --help";
}

TEST(GoodInvocation, SearchWithPins) {
  const fs::path out = scratch() / "recipe.json";
  const Outcome r = run_lcplan({"search", "--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--tp", "1", "--pp", "1",
                     "--ep", "8", "--cp", "4", "--out", out.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(out));
  // The recipe search wrote is accepted by estimate --plan.
  const Outcome e = run_lcplan({"estimate", "--plan", out.string(), "--json"});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.out.find("\"peak_bytes\""), std::string::npos);
}

}  // namespace
