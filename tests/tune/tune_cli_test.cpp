// `lcplan tune` end to end (issue 14's convergence test): lcplan-exec under mpirun -np 4 on a scaled model
// (tests/tune/tiny-moe.json on tests/tune/cpu-4-ranks.json), starting from a deliberately wrong calibration, must
// leave predictions of the plans it ran within 15% of their measured step times (the median run; every run within
// 50%, see kRunSpread) and choose the measured-fastest;
// run again, it resumes from its log and runs nothing new. A command template (tests/tune/fake_megatron.sh printing
// Megatron-LM log lines) goes through log ingestion, an out-of-memory run included; bad input gets one sentence.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kSrc = LCPLAN_SOURCE_DIR;

struct Outcome {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("lcplan_tune_cli_test." + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  static const struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup;
  return dir;
}

Outcome run_lcplan(const std::vector<std::string>& args) {
  const fs::path out = scratch() / "stdout.txt", err = scratch() / "stderr.txt";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) std::_Exit(126);
    ::chdir(kSrc.c_str());  // the plans name the test's model and hardware files relative to the source tree
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
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(out), slurp(err)};
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

// The deliberately wrong start: the default profile with the coefficients a CPU step depends on off by a factor of
// 10, every one towards a slower step (GEMM, grouped GEMM and attention efficiency / 10; launch and step overhead
// x10), no per-hardware values: ~25x too slow on a release build, ~3x on a sanitized one (about 10x slower). One
// direction for every term, so no build speed can make the start right by chance (efficiencies cannot rise past 1).
fs::path wrong_calibration() {
  nlohmann::json j = read_json(kSrc + "/data/calibration/default.json");
  auto& c = j["coefficients"];
  auto scale = [&](const char* key, double f, double hi) {
    c[key]["value"] = std::min(hi, c[key]["value"].get<double>() * f);
    c[key]["provenance"] = std::string("deliberately wrong (tests/tune/tune_cli_test.cpp)");
  };
  scale("time.gemm_efficiency", 0.1, 1);
  scale("time.grouped_gemm_efficiency", 0.1, 1);
  scale("time.attention_efficiency", 0.1, 1);
  scale("time.launch_seconds", 10, 1);
  scale("time.step_overhead_seconds", 10, 1e9);
  j["per_hardware"] = nlohmann::json::object();
  j["name"] = "wrong";
  const fs::path p = scratch() / "wrong.json";
  std::ofstream(p) << j.dump(2);
  return p;
}

std::vector<std::string> exec_tune(const fs::path& dir) {
  return {"tune", "--model", "tests/tune/tiny-moe.json", "--hardware", "tests/tune/cpu-4-ranks.json", "--gpus", "4",
          "--seq", "1024", "--global-batch", "4", "--headroom", "0.5", "--calibration", wrong_calibration().string(),
          "--launcher", "exec", "--mpirun", std::string(LCPLAN_MPIEXEC) + " --allow-run-as-root --oversubscribe",
          "--exec-args", "--steps 5", "--plans-per-round", "3", "--max-runs", "6", "--run-dir", (dir / "runs").string(),
          "--out", (dir / "best.json").string(), "--calibration-out", (dir / "tuned.json").string()};
}

TEST(TuneCli, ExecConvergesFromAWrongCalibrationAndResumes) {
  const fs::path dir = scratch() / "exec";
  fs::create_directories(dir);
  const Outcome a = run_lcplan(exec_tune(dir));
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const nlohmann::json log = read_json(dir / "runs" / "tune-log.json");
  const auto& runs = log.at("runs");
  ASSERT_GE(runs.size(), 2u) << a.out;
  // Every plan it ran, estimated with the calibration it wrote, against the step time measured -- for the runs whose
  // own steps agree within 10% (other work on these cores makes a run's steps, and so the run, unrepeatable). The
  // median run within 15% says the refit converged; every run within kRunSpread, because a steady run is still only as
  // repeatable as this host: one plan run 20 times in a row here measured 0.40-0.69 s, its steps steady within each
  // run, while a streaming loop's time drifted by 20% over the same minutes (memory bandwidth shared with neighbours).
  constexpr double kRunSpread = 0.5;
  double fastest = 1e300;
  nlohmann::json fastest_plan;
  int steady = 0;
  std::string unsteady, table;
  std::vector<double> errors;
  for (const auto& r : runs) {
    const auto& m = r.at("measurement");
    ASSERT_TRUE(m.contains("step_seconds")) << m.dump();
    const double measured = m.at("step_seconds").get<double>();
    if (measured < fastest) fastest = measured, fastest_plan = r.at("plan");
    double lo = 1e300, hi = 0;
    const auto& steps = m.at("per_step");
    for (size_t i = 1; i < steps.size(); ++i) {  // the first step warms up
      lo = std::min(lo, steps[i].at("seconds").get<double>());
      hi = std::max(hi, steps[i].at("seconds").get<double>());
    }
    if (hi > 1.1 * lo) {
      unsteady += " run " + std::to_string(r.at("index").get<int>()) + " (steps " + std::to_string(lo) + "-" + std::to_string(hi) + " s)";
      continue;
    }
    ++steady;
    const fs::path plan = dir / ("plan-" + std::to_string(r.at("index").get<int>()) + ".json");
    std::ofstream(plan) << r.at("plan").dump();
    const Outcome e = run_lcplan({"estimate", "--plan", plan.string(), "--calibration", (dir / "tuned.json").string(), "--json"});
    ASSERT_EQ(e.status, 0) << e.err;
    const double predicted = nlohmann::json::parse(e.out).at("time").at("step_seconds").get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, kRunSpread) << "run " << r.at("index") << ": predicted " << predicted
                                                       << " s, measured " << measured << " s\n" << a.out;
    errors.push_back(std::abs(predicted / measured - 1));
    table += " run " + std::to_string(r.at("index").get<int>()) + ": " + std::to_string(predicted) + " s predicted, " +
             std::to_string(measured) + " s measured;";
  }
  if (!errors.empty()) {
    std::sort(errors.begin(), errors.end());
    const size_t n = errors.size();
    const double median = n % 2 ? errors[n / 2] : 0.5 * (errors[n / 2 - 1] + errors[n / 2]);
    EXPECT_LE(median, 0.15) << "median |predicted / measured - 1| over the steady runs:" << table << "\n" << a.out;
  }
  // The round before the first refit was far off: the wrong start was really wrong.
  EXPECT_GT(log.at("rounds").at(0).at("error_before").get<double>(), 0.3) << a.out;
  // The chosen recipe is the measured-fastest run.
  EXPECT_EQ(read_json(dir / "best.json"), fastest_plan);

  // Started again with the same flags: resumes from the log, runs nothing, chooses the same plan.
  const Outcome b = run_lcplan(exec_tune(dir));
  ASSERT_EQ(b.status, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("resuming"), std::string::npos) << b.out;
  EXPECT_EQ(read_json(dir / "runs" / "tune-log.json").at("runs").size(), runs.size());
  EXPECT_EQ(read_json(dir / "best.json"), fastest_plan);
  if (steady < 2) GTEST_SKIP() << "the cores were too busy to time the runs (" << unsteady << "); rerun on a quiet machine";
}

std::vector<std::string> template_tune(const fs::path& dir, const std::string& launcher) {
  return {"tune", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "4096", "--global-batch", "64", "--tp", "1",
          "--pp", "1", "--launcher", launcher, "--plans-per-round", "3", "--max-runs", "6", "--run-dir",
          (dir / "runs").string(), "--out", (dir / "best.json").string()};
}

TEST(TuneCli, TemplateLauncherIngestsMegatronLogs) {
  const fs::path dir = scratch() / "template";
  fs::create_directories(dir);
  const Outcome a = run_lcplan(template_tune(dir, "sh tests/tune/fake_megatron.sh {megatron_flags}"));
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const nlohmann::json log = read_json(dir / "runs" / "tune-log.json");
  double fastest = 1e300;
  nlohmann::json fastest_plan;
  for (const auto& r : log.at("runs")) {
    const auto& m = r.at("measurement");
    const auto& q = r.at("plan").at("parallel");
    if (q.at("cp") == 1 && q.at("ep") == 1) {  // the fake launch runs out of memory there
      EXPECT_EQ(m.value("status", ""), "out_of_memory") << m.dump();
      continue;
    }
    // The fake's step time, through Megatron's log lines and the ingestion (warm-up line skipped).
    const double want = (2000 + 40 * q.at("ep").get<int>() + 90 * q.at("cp").get<int>()) / 1000.0;
    EXPECT_NEAR(m.at("step_seconds").get<double>(), want, 1e-9) << m.dump();
    if (want < fastest) fastest = want, fastest_plan = r.at("plan");
  }
  ASSERT_FALSE(fastest_plan.is_null()) << a.out;
  EXPECT_EQ(read_json(dir / "best.json"), fastest_plan);
}

TEST(TuneCli, BadInputGetsOneSentence) {
  const fs::path dir = scratch() / "bad";
  struct Case {
    std::vector<std::string> args;
    std::string want;
  } cases[] = {
      {template_tune(dir, "run {plan} {gpu}"), "{gpu}"},
      {template_tune(dir, "srun train.sh"), "no plan placeholder"},
      {template_tune(dir, "sh -c 'echo broken node; exit 3' {plan}"), "exit status 3"},
      {[&] {
         auto v = template_tune(dir, "exec");
         v.insert(v.end(), {"--implementation", "megatron"});
         return v;
       }(),
       "--implementation megatron"},
      {[&] {
         auto v = template_tune(dir, "x {plan}");
         v.insert(v.end(), {"--fit", "time.no_such"});
         return v;
       }(),
       "time.no_such"},
      {[&] {
         auto v = template_tune(dir, "x {plan}");
         v.insert(v.end(), {"--plans-per-round", "0"});
         return v;
       }(),
       "--plans-per-round"},
  };
  for (const Case& c : cases) {
    const Outcome o = run_lcplan(c.args);
    EXPECT_NE(o.status, 0) << c.want;
    EXPECT_NE(o.err.find(c.want), std::string::npos) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
}

}  // namespace
