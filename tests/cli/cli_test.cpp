// CLI robustness: runs the built `lcplan` binary over a table of bad invocations (each must exit non-zero, print
// exactly one line on stderr that is one sentence, and nothing on stdout that could be mistaken for a result) and
// a few good ones that must succeed.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Scratch folder for this test binary: files the table refers to (bad configs, an unreadable file, a directory).
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("lcplan_cli_test." + std::to_string(::getpid()));
    fs::create_directories(d / "a_directory.json");
    std::ofstream(d / "bad_config.json") << R"({"model_type": "llama", "hidden_size": "wide", "num_hidden_layers": 4,
      "vocab_size": 1000, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 64})";
    std::ofstream(d / "not_json.json") << "{ this is not json";
    std::ofstream(d / "unreadable.json") << "{}";
    ::chmod((d / "unreadable.json").c_str(), 0);
    std::ofstream(d / "bad_plan.json") << R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "seq_len": "128k", "tensor_parallel": 2})";
    std::ofstream(d / "empty_measurements.json") << "[]";
    std::ofstream(d / "junk.json", std::ios::binary) << std::string("\x7f" "ELF\0\xff\xfe", 8);
    return d;
  }();
  // Removed at exit (the forked children leave through execv or _Exit, so only the test process runs this).
  static const struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup;
  return dir;
}

std::string path(const char* name) { return (scratch() / name).string(); }

// Runs lcplan with the given arguments (no shell), capturing stdout and stderr through files.
Outcome run_lcplan(const std::vector<std::string>& args) {
  const fs::path out = scratch() / "stdout.txt", err = scratch() / "stderr.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen(out.c_str(), "w", stdout);
    std::freopen(err.c_str(), "w", stderr);
    std::vector<char*> argv;
    std::string bin = LCPLAN_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  Outcome r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
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
};

std::vector<Bad> bad_invocations() {
  auto est = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"estimate"};
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
      {"unknown model", {"estimate", "--model", "qwen3.5", "--gpus", "32", "--seq", "128k"}, {"qwen3.5", "qwen3.5-35b-a3b"}},
      {"unknown hardware", est({"--hardware", "h1000"}), {"h1000"}},
      {"unknown implementation", est({"--implementation", "deepspeed"}), {"deepspeed"}},
      {"malformed config.json", {"estimate", "--model", path("bad_config.json"), "--gpus", "8", "--seq", "4k"}, {"hidden_size"}},
      {"config that is not JSON", {"estimate", "--model", path("not_json.json"), "--gpus", "8", "--seq", "4k"}, {"not_json.json"}},
      {"tp not dividing heads", est({"--tp", "3", "--gpus", "48"}), {"tp"}},
      {"ep not dividing experts", est({"--ep", "3", "--gpus", "48"}), {"ep", "experts"}},
      {"gpus not divisible by tp*pp*cp", est({"--gpus", "30", "--cp", "4"}), {"tp*pp*cp"}},
      {"layers not split by pp", est({"--pp", "9", "--gpus", "72"}), {"layers"}},
      {"recompute layers without full recompute", est({"--recompute-layers", "2"}), {"recompute"}},
      {"ep chunks out of range", est({"--ep-chunks", "5", "--ep", "8"}), {"ep_chunks"}},
      {"--fsdp with --dist-opt", est({"--fsdp", "--dist-opt"}), {"--dist-opt", "fsdp"}},
      {"--fsdp with --optimizer-sharding none", est({"--fsdp", "--optimizer-sharding", "none"}), {"--fsdp"}},
      {"--linear-ce with --no-linear-ce", est({"--linear-ce", "--no-linear-ce"}), {"--linear-ce", "--no-linear-ce"}},
      {"search: --tp 3 for a 16-head model", srch({"--tp", "3"}), {"--tp", "3"}},
      {"search: --fsdp with --dist-opt", srch({"--fsdp", "--dist-opt"}), {"--dist-opt", "fsdp"}},
      {"search: bad objective", srch({"--objective", "speed"}), {"speed"}},
      {"search: negative headroom", srch({"--headroom", "-1"}), {"--headroom"}},
      {"search: nothing fits", {"search", "--model", "deepseek-v3", "--gpus", "8", "--seq", "1M"}, {"fits"}},
      {"plan file missing", {"estimate", "--plan", path("no_such_plan.json")}, {"no_such_plan.json"}},
      // Root reads any file whatever its mode: there the unreadable file is replaced by one that is not even text.
      ::geteuid() != 0 ? Bad{"plan file unreadable", {"estimate", "--plan", path("unreadable.json")}, {"unreadable.json"}}
                       : Bad{"plan file of binary junk", {"estimate", "--plan", path("junk.json")}, {"junk.json"}},
      {"plan file is a directory", {"estimate", "--plan", path("a_directory.json")}, {"a_directory.json", "directory"}},
      {"plan file with unknown key", {"estimate", "--plan", path("bad_plan.json")}, {"tensor_parallel"}},
      {"config path is a directory", {"estimate", "--model", path("a_directory.json"), "--gpus", "8", "--seq", "4k"}, {"directory"}},
      {"calibration file missing", est({"--calibration", path("no_such_calibration.json")}), {"no_such_calibration.json"}},
      {"--out into a missing directory", est({"--out", path("missing_dir/estimate.json")}), {"missing_dir"}},
      {"--out is a directory", est({"--out", path("a_directory.json")}), {"a_directory.json"}},
      {"search --out into a missing directory", srch({"--out", path("missing_dir/recipe.json")}), {"missing_dir"}},
      {"calibrate without measurements", {"calibrate", "--out", path("calib.json")}, {"--measurements"}},
      {"calibrate with a missing measurements file",
       {"calibrate", "--measurements", path("no_such_runs.json"), "--out", path("calib.json")}, {"no_such_runs.json"}},
      {"calibrate with an empty measurements file",
       {"calibrate", "--measurements", path("empty_measurements.json"), "--out", path("calib.json")}, {"measurements"}},
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
  const Outcome r = run_lcplan(b.args);
  EXPECT_NE(r.status, 0) << cmd << ": exit code 0";
  EXPECT_LT(r.status, 128) << cmd << ": killed by a signal (crash)";
  EXPECT_NE(r.status, 3) << cmd << ": reported as an internal error";
  EXPECT_TRUE(r.out.empty()) << cmd << ": printed on stdout:\n" << r.out.substr(0, 2000);
  expect_one_sentence(r.err, cmd);
  for (const auto& word : b.mentions) EXPECT_NE(r.err.find(word), std::string::npos) << cmd << ": stderr does not mention \"" << word << "\": " << r.err;
  EXPECT_FALSE(fs::exists(scratch() / "missing_dir")) << cmd << ": created the missing directory";
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

TEST(GoodInvocation, EstimateJsonOutIsTheRecord) {
  const fs::path out = scratch() / "estimate.json";
  std::vector<std::string> args = ref({"--ep", "8", "--cp", "4", "--json", "--out", out.string()});
  args.insert(args.begin(), "estimate");
  const Outcome r = run_lcplan(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(out), r.out) << "--out holds a different record than --json printed";
  EXPECT_NE(r.out.find("\"peak_bytes\""), std::string::npos);
}

TEST(GoodInvocation, Models) {
  const Outcome r = run_lcplan({"models"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("qwen3.5-35b-a3b"), std::string::npos);
  EXPECT_NE(r.out.find("llama-3.1-405b"), std::string::npos);
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
