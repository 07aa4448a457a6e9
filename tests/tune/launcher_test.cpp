// The tune launcher (tune/launcher.h): templates, quoting, running a shell command with a log and a time limit, and
// reading a run's measurement from a record file or a Megatron-LM log.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/user_error.h"
#include "tune/launcher.h"

namespace lcplan {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("lcplan-launcher-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Plan small_plan() {
  Plan p;
  p.model = "qwen3-30b-a3b";
  p.gpus = 8;
  p.seq_len = 4096;
  p.global_batch = 64;
  p.parallel.ep = 8;
  return p;
}

TEST(LaunchTemplate, ExpandsPlaceholdersAndLiteralBraces) {
  const std::string t = "srun -n {gpus} run.sh {plan} {megatron_flags} --json '{{\"a\": 1}}' > {log}";
  EXPECT_EQ(error_of([&] { check_launch_template(t); }), "");
  EXPECT_EQ(expand_launch_template(t, {{"gpus", "8"}, {"plan", "p.json"}, {"megatron_flags", "--tp 1"}, {"log", "l.txt"}}),
            "srun -n 8 run.sh p.json --tp 1 --json '{\"a\": 1}' > l.txt");
}

TEST(LaunchTemplate, RefusesWhatCannotWork) {
  EXPECT_NE(error_of([] { check_launch_template("run {plan} {gpu}"); }).find("{gpu}"), std::string::npos);
  EXPECT_NE(error_of([] { check_launch_template("run {plan"); }).find("unclosed"), std::string::npos);
  const std::string same = error_of([] { check_launch_template("srun -n {gpus} train.sh"); });
  EXPECT_NE(same.find("no plan placeholder"), std::string::npos) << same;
  EXPECT_EQ(error_of([] { check_launch_template("x {flags}"); }), "");
}

TEST(ShellQuote, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_quote("/a/b-c_d.json"), "/a/b-c_d.json");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(RunShell, CapturesOutputAndExitStatus) {
  const fs::path d = temp_dir("run");
  const ProcessResult r = run_shell("echo hello; echo oops >&2; exit 3", (d / "log").string(), 30);
  EXPECT_EQ(r.exit_status, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(read(d / "log"), "hello\noops\n");
}

TEST(RunShell, StopsTheWholeGroupAtTheTimeLimit) {
  const fs::path d = temp_dir("timeout");
  const auto t0 = std::chrono::steady_clock::now();
  // A child of the shell that would outlive it: the group kill must end it too (its marker file never appears).
  const ProcessResult r = run_shell("(sleep 3; touch " + (d / "late").string() + ") & sleep 30", (d / "log").string(), 0.5);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(took, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_FALSE(fs::exists(d / "late"));
}

TEST(RunMeasurement, ReadsTheRecordTheCommandWrote) {
  const fs::path d = temp_dir("record");
  write(d / "m.json", R"([{"id": "x", "plan": {"model": "qwen3-30b-a3b", "gpus": 8, "seq_len": 4096, "parallel": {"ep": 8}},
                           "step_seconds": 1.5, "peak_bytes": 1e9}])");
  write(d / "log", "");
  const Measurement m = read_run_measurement({}, {(d / "m.json").string(), (d / "log").string()}, small_plan(), "run-001", 1);
  EXPECT_EQ(m.id, "run-001");
  EXPECT_DOUBLE_EQ(*m.step_seconds, 1.5);
}

TEST(RunMeasurement, ReadsAMegatronLogWhenNoRecordWasWritten) {
  const fs::path d = temp_dir("megatron");
  std::string log;
  for (int it = 10; it <= 40; it += 10)
    log += " [2026-01-01 10:00:00] iteration       " + std::to_string(it) +
           "/     100 | consumed samples:          640 | elapsed time per iteration (ms): " + (it == 10 ? "3000.0" : "1200.0") +
           " | throughput per GPU (TFLOP/s/GPU): 300.0 | learning rate: 1.0E-04 | global batch size:    64 | lm loss: 6.0E+00 | "
           "loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n";
  write(d / "log", log);
  const Measurement m = read_run_measurement({}, {(d / "none.json").string(), (d / "log").string()}, small_plan(), "run-002", 1);
  ASSERT_TRUE(m.step_seconds.has_value());
  EXPECT_NEAR(*m.step_seconds, 1.2, 1e-9);  // the warm-up iteration skipped
}

TEST(RunMeasurement, OutOfMemoryIsAResultAndOtherFailuresAreErrors) {
  const fs::path d = temp_dir("fail");
  write(d / "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n");
  ProcessResult failed;
  failed.exit_status = 1;
  const Measurement m = read_run_measurement(failed, {(d / "none.json").string(), (d / "oom").string()}, small_plan(), "run-3", 1);
  EXPECT_EQ(m.status, MeasurementStatus::OutOfMemory);

  write(d / "crash", "starting\nsome output\nsegfault in rank 3\n");
  const std::string e = error_of([&] {
    read_run_measurement(failed, {(d / "none.json").string(), (d / "crash").string()}, small_plan(), "run-4", 1);
  });
  EXPECT_NE(e.find("exit status 1"), std::string::npos) << e;
  EXPECT_NE(e.find("segfault in rank 3"), std::string::npos) << e;
  EXPECT_NE(e.find((d / "crash").string()), std::string::npos) << e;

  ProcessResult timed_out;
  timed_out.timed_out = true;
  EXPECT_NE(error_of([&] {
              read_run_measurement(timed_out, {(d / "none.json").string(), (d / "crash").string()}, small_plan(), "run-5", 1);
            }).find("time limit"),
            std::string::npos);
  write(d / "empty", "nothing useful\n");
  EXPECT_NE(error_of([&] {
              read_run_measurement({}, {(d / "none.json").string(), (d / "empty").string()}, small_plan(), "run-6", 1);
            }).find("not a usable Megatron-LM training log"),
            std::string::npos);
}

}  // namespace
}  // namespace lcplan
