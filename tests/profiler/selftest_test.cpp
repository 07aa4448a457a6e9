// lcplan selftest --gpu without a GPU: discovery of the CUDA test binaries, the verdict of one run, and running a
// binary with its output captured through a pipe.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/json_file.h"
#include "profiler/selftest.h"

namespace fs = std::filesystem;

namespace lcplan::profiler {
namespace {

TEST(Selftest, Classify) {
  EXPECT_EQ(classify(0, "[ RUN      ] A.B\n[       OK ] A.B (1 ms)\n"), Verdict::Pass);
  EXPECT_EQ(classify(0, "[ RUN      ] A.B\n[  SKIPPED ] A.B (0 ms)\n"), Verdict::Skipped);
  EXPECT_EQ(classify(1, "[  FAILED  ] A.B\n"), Verdict::Fail);
  EXPECT_EQ(classify(134, ""), Verdict::Fail);  // a signal
  EXPECT_EQ(classify(0, "[       OK ] A.B\n[  SKIPPED ] A.C\n"), Verdict::Pass);
}

TEST(Selftest, FindsTheCudaTestBinaries) {
  const fs::path dir = fs::temp_directory_path() / ("lcplan_selftest_test." + std::to_string(::getpid()));
  fs::create_directories(dir / "tests" / "moe");
  fs::create_directories(dir / "CMakeFiles");
  auto exe = [&](const fs::path& p, bool x) {
    write_file_atomic(p.string(), "#!/bin/sh\nexit 0\n");
    ::chmod(p.c_str(), x ? 0755 : 0644);
  };
  exe(dir / "tests" / "attention_cuda_test", true);
  exe(dir / "tests" / "moe" / "test_moe_cuda", true);
  exe(dir / "tests" / "moe" / "test_moe_kernels_cuda", true);
  exe(dir / "tests" / "linear_ce_cuda_vocab_parallel_test", true);
  exe(dir / "tests" / "executor_param_store_cuda_test", true);
  exe(dir / "tests" / "attention_test", true);         // CPU test: not selected
  exe(dir / "tests" / "linear_ce_cuda_test", false);   // not executable
  exe(dir / "CMakeFiles" / "x_cuda_test", true);       // build scratch
  const std::vector<GpuTest> found = find_gpu_tests(dir.string());
  std::vector<std::string> names;
  for (const GpuTest& t : found) names.push_back(t.name + ":" + std::to_string(t.mpi_ranks));
  EXPECT_EQ(names, (std::vector<std::string>{"attention_cuda_test:0", "executor_param_store_cuda_test:2",
                                             "linear_ce_cuda_vocab_parallel_test:2",
                                             "test_moe_cuda:2", "test_moe_kernels_cuda:0"}));
  const TestRun r = run_captured({found.front().path}, 30);
  EXPECT_EQ(r.status, 0);
  fs::remove_all(dir);
}

TEST(Selftest, RunCapturedReadsOutputStatusAndTimeout) {
  const TestRun ok = run_captured({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 30);
  EXPECT_EQ(ok.status, 3);
  EXPECT_NE(ok.output.find("out"), std::string::npos);
  EXPECT_NE(ok.output.find("err"), std::string::npos);
  const TestRun slow = run_captured({"/bin/sh", "-c", "sleep 30"}, 0.5);
  EXPECT_EQ(slow.status, 124);
  EXPECT_LT(slow.seconds, 10);
  const TestRun missing = run_captured({"/no/such/binary"}, 5);
  EXPECT_NE(missing.status, 0);
}

}  // namespace
}  // namespace lcplan::profiler
