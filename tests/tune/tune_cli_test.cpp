// `lcplan tune` end to end. On a machine whose behaviour the test knows (tests/tune/synthetic_machine.cpp: a hidden
// true calibration, runs wobbling by a seeded +-2%), a tune started from a deliberately wrong calibration must leave
// predictions of the plans it ran within 15% of their measured step times (the median run; every run within 50%)
// and choose the measured-fastest; run again, it resumes from its log and runs nothing new. The exec launcher runs
// lcplan-exec under mpirun -np 4 for real and must record, choose and resume the same way (its wall times are a
// benchmark's business: bench/executor). A command template (tests/tune/fake_megatron.sh printing Megatron-LM log
// lines) goes through log ingestion, an out-of-memory run included; bad input gets one sentence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/cli_runner.h"

namespace fs = std::filesystem;

namespace {

using lcplan::testing::Outcome;
using lcplan::testing::slurp;

const std::string kSrc = LCPLAN_SOURCE_DIR;

const fs::path& scratch() { return lcplan::testing::scratch("lcplan_tune_cli_test"); }

// The plans name the test's model and hardware files relative to the source tree, so lcplan runs there.
Outcome run_lcplan(std::vector<std::string> args) {
  args.insert(args.begin(), LCPLAN_BINARY);
  lcplan::testing::RunOptions opt;
  opt.cwd = kSrc;
  return lcplan::testing::run_program(args, opt);
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

// The default profile with the coefficients a step depends on moved by `factor` (per key), no per-hardware values.
fs::path calibration_file(const std::string& name, const std::vector<std::pair<const char*, double>>& factors) {
  nlohmann::json j = read_json(kSrc + "/data/calibration/default.json");
  auto& c = j["coefficients"];
  for (const auto& [key, f] : factors) {
    double v = c[key]["value"].get<double>() * f;
    if (std::string(key).find("efficiency") != std::string::npos) v = std::min(1.0, v);
    c[key]["value"] = v;
    c[key]["provenance"] = std::string("tests/tune/tune_cli_test.cpp: ") + name;
  }
  j["per_hardware"] = nlohmann::json::object();
  // The known machine has a framework's step overhead (lcplan-exec's own prior is 0): the refit has one to find.
  j["per_implementation"]["lcplan-exec"].erase("time.step_overhead_seconds");
  j["name"] = name;
  const fs::path p = scratch() / (name + ".json");
  std::ofstream(p) << j.dump(2);
  return p;
}

// The machine's hidden truth, and a start wrong by factors of 2-4 in every coefficient the tune refits, each towards
// a slower step (a refit must find all four).
fs::path truth_calibration() {
  return calibration_file("truth", {{"time.gemm_efficiency", 0.5}, {"time.attention_efficiency", 0.6},
                                    {"time.grouped_gemm_efficiency", 0.7}, {"time.step_overhead_seconds", 1.5}});
}
fs::path wrong_calibration() {
  return calibration_file("wrong", {{"time.gemm_efficiency", 0.5 / 3}, {"time.attention_efficiency", 0.6 / 2.5},
                                    {"time.grouped_gemm_efficiency", 0.7 / 3}, {"time.step_overhead_seconds", 1.5 * 4}});
}

std::vector<std::string> known_machine_tune(const fs::path& dir) {
  const std::string launcher = std::string(LCPLAN_SYNTHETIC_MACHINE) + " --plan {plan} --out {out} --truth " +
                               truth_calibration().string() + " --seed 7";
  return {"tune", "--model", "tests/tune/tiny-moe.json", "--hardware", "tests/tune/cpu-4-ranks.json", "--gpus", "4",
          "--seq", "1024", "--global-batch", "4", "--headroom", "0.5", "--calibration", wrong_calibration().string(),
          "--implementation", "lcplan-exec", "--launcher", launcher, "--fit",
          "time.gemm_efficiency,time.attention_efficiency,time.grouped_gemm_efficiency,time.step_overhead_seconds",
          "--plans-per-round", "3", "--max-runs", "9", "--run-dir", (dir / "runs").string(),
          "--out", (dir / "best.json").string(), "--calibration-out", (dir / "tuned.json").string()};
}

// The measured-fastest run's plan of a tune log.
nlohmann::json fastest_plan(const nlohmann::json& log) {
  double fastest = 1e300;
  nlohmann::json plan;
  for (const auto& r : log.at("runs")) {
    const auto& m = r.at("measurement");
    if (m.contains("step_seconds") && m.at("step_seconds").get<double>() < fastest)
      fastest = m.at("step_seconds").get<double>(), plan = r.at("plan");
  }
  return plan;
}

// The recipe tune --out wrote is `plan`: its model and hardware paths are relative to the recipe's folder (README
// "Records"), the plan's to the source tree the tune ran in.
void expect_recipe_is(const fs::path& recipe, nlohmann::json plan) {
  nlohmann::json got = read_json(recipe);
  for (const char* k : {"model", "hardware"}) {
    const std::string a = got.value(k, ""), b = plan.value(k, "");
    if (b.find('/') == std::string::npos) EXPECT_EQ(a, b) << k;  // a zoo name or shipped profile stays as it is
    else EXPECT_TRUE(fs::equivalent(recipe.parent_path() / a, fs::path(kSrc) / b)) << k << ": " << a << " vs " << b;
    got.erase(k);
    plan.erase(k);
  }
  EXPECT_EQ(got, plan);
}

TEST(TuneCli, ConvergesOnAKnownMachineFromAWrongCalibrationAndResumes) {
  const fs::path dir = scratch() / "known";
  fs::create_directories(dir);
  const Outcome a = run_lcplan(known_machine_tune(dir));
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const nlohmann::json log = read_json(dir / "runs" / "tune-log.json");
  const auto& runs = log.at("runs");
  ASSERT_GE(runs.size(), 2u) << a.out;
  // Every plan it ran, estimated with the calibration it wrote, against the step time measured: the median run
  // within 15% says the refit converged; every run within 50%.
  std::vector<double> errors;
  std::string table;
  for (const auto& r : runs) {
    const auto& m = r.at("measurement");
    if (m.value("status", "ok") != "ok") continue;
    const double measured = m.at("step_seconds").get<double>();
    const fs::path plan = dir / ("plan-" + std::to_string(r.at("index").get<int>()) + ".json");
    std::ofstream(plan) << r.at("plan").dump();
    const Outcome e = run_lcplan({"estimate", "--plan", plan.string(), "--calibration", (dir / "tuned.json").string(), "--json"});
    ASSERT_EQ(e.status, 0) << e.err;
    const double predicted = nlohmann::json::parse(e.out).at("time").at("step_seconds").get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, 0.5) << "run " << r.at("index") << ": predicted " << predicted
                                                << " s, measured " << measured << " s\n" << a.out;
    errors.push_back(std::abs(predicted / measured - 1));
    table += " run " + std::to_string(r.at("index").get<int>()) + ": " + std::to_string(predicted) + " s predicted, " +
             std::to_string(measured) + " s measured;";
  }
  ASSERT_FALSE(errors.empty()) << a.out;
  std::sort(errors.begin(), errors.end());
  const size_t n = errors.size();
  const double median = n % 2 ? errors[n / 2] : 0.5 * (errors[n / 2 - 1] + errors[n / 2]);
  EXPECT_LE(median, 0.15) << "median |predicted / measured - 1|:" << table << "\n" << a.out;
  // The round before the first refit was far off: the wrong start was really wrong.
  EXPECT_GT(log.at("rounds").at(0).at("error_before").get<double>(), 0.3) << a.out;
  // The chosen recipe is the measured-fastest run.
  expect_recipe_is(dir / "best.json", fastest_plan(log));

  // Started again with the same flags: resumes from the log, runs nothing, chooses the same plan.
  const Outcome b = run_lcplan(known_machine_tune(dir));
  ASSERT_EQ(b.status, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("resuming"), std::string::npos) << b.out;
  EXPECT_EQ(read_json(dir / "runs" / "tune-log.json").at("runs").size(), runs.size());
  expect_recipe_is(dir / "best.json", fastest_plan(log));
}

// The machine's own CPU calibration (cpu-measured holds lcplan-exec's per-step overhead at 0): the default fit set
// is what that profile can fit, so the tune finishes; a changed --fit resumes from the same runs; a --fit naming a
// coefficient the profile holds at 0 is refused before any run, naming --fit (issue 28, item 4).
std::vector<std::string> cpu_profile_tune(const fs::path& dir) {
  const std::string launcher = std::string(LCPLAN_SYNTHETIC_MACHINE) + " --plan {plan} --out {out} --truth cpu-measured";
  return {"tune", "--model", "tests/tune/tiny-moe.json", "--hardware", "cpu-amd-epyc-2c", "--gpus", "2", "--seq",
          "1024", "--global-batch", "2", "--headroom", "0.5", "--calibration", "cpu-measured", "--implementation",
          "lcplan-exec", "--launcher", launcher, "--plans-per-round", "2", "--max-runs", "4", "--run-dir",
          (dir / "runs").string(), "--out", (dir / "best.json").string()};
}

TEST(TuneCli, TheMachinesOwnCalibrationTunesAndAChangedFitResumes) {
  const fs::path dir = scratch() / "cpu";
  fs::create_directories(dir);
  const Outcome a = run_lcplan(cpu_profile_tune(dir));
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const nlohmann::json log = read_json(dir / "runs" / "tune-log.json");
  const size_t runs = log.at("runs").size();
  ASSERT_GE(runs, 2u) << a.out;
  for (const auto& k : log.at("refit").at("fit")) EXPECT_NE(k, "time.step_overhead_seconds") << log.at("refit");

  std::vector<std::string> refit = cpu_profile_tune(dir);
  refit.insert(refit.end(), {"--fit", "time.gemm_efficiency"});
  const Outcome b = run_lcplan(refit);
  ASSERT_EQ(b.status, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("resuming"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("refitted"), std::string::npos) << b.out;
  const nlohmann::json again = read_json(dir / "runs" / "tune-log.json");
  EXPECT_EQ(again.at("runs").size(), runs);  // the budget was spent: nothing new ran
  EXPECT_EQ(again.at("refit").at("fit"), nlohmann::json::array({"time.gemm_efficiency"}));
  for (size_t i = 0; i < runs; ++i) EXPECT_EQ(again.at("runs")[i].at("plan"), log.at("runs")[i].at("plan")) << i;

  fs::create_directories(scratch() / "cpu-zero");
  std::vector<std::string> zero = cpu_profile_tune(scratch() / "cpu-zero");
  zero.insert(zero.end(), {"--fit", "time.step_overhead_seconds"});
  const Outcome c = run_lcplan(zero);
  EXPECT_EQ(c.status, 2) << c.out << c.err;
  EXPECT_NE(c.err.find("--fit time.step_overhead_seconds"), std::string::npos) << c.err;
  EXPECT_EQ(std::count(c.err.begin(), c.err.end(), '\n'), 1) << c.err;
  EXPECT_FALSE(fs::exists(scratch() / "cpu-zero" / "runs")) << "a refused tune left a run folder behind";
}

std::vector<std::string> exec_tune(const fs::path& dir) {
  return {"tune", "--model", "tests/tune/tiny-moe.json", "--hardware", "tests/tune/cpu-4-ranks.json", "--gpus", "4",
          "--seq", "1024", "--global-batch", "4", "--headroom", "0.5", "--launcher", "exec", "--mpirun",
          std::string(LCPLAN_MPIEXEC) + " --allow-run-as-root --oversubscribe", "--exec-args", "--steps 2",
          "--plans-per-round", "2", "--max-runs", "2", "--run-dir", (dir / "runs").string(),
          "--out", (dir / "best.json").string(), "--calibration-out", (dir / "tuned.json").string()};
}

TEST(TuneCli, ExecLauncherRunsLcplanExecRecordsAndResumes) {
  const fs::path dir = scratch() / "exec";
  fs::create_directories(dir);
  const Outcome a = run_lcplan(exec_tune(dir));
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  const nlohmann::json log = read_json(dir / "runs" / "tune-log.json");
  const auto& runs = log.at("runs");
  ASSERT_EQ(runs.size(), 2u) << a.out;
  for (const auto& r : runs) {
    const auto& m = r.at("measurement");
    ASSERT_TRUE(m.contains("step_seconds")) << m.dump();
    EXPECT_EQ(m.at("per_step").size(), 2u) << m.dump();  // lcplan-exec's own record, every step
    EXPECT_EQ(m.at("plan").at("implementation"), "lcplan-exec") << m.dump();
  }
  expect_recipe_is(dir / "best.json", fastest_plan(log));
  EXPECT_TRUE(fs::exists(dir / "tuned.json"));

  const Outcome b = run_lcplan(exec_tune(dir));
  ASSERT_EQ(b.status, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("resuming"), std::string::npos) << b.out;
  EXPECT_EQ(read_json(dir / "runs" / "tune-log.json").at("runs").size(), runs.size());
  expect_recipe_is(dir / "best.json", fastest_plan(log));
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
  expect_recipe_is(dir / "best.json", fastest_plan);
}

TEST(TuneCli, BadInputGetsOneSentence) {
  const fs::path dir = scratch() / "bad";
  fs::create_directories(dir);
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
