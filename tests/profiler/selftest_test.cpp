// lcplan selftest --gpu without a GPU: the GPU test manifest, the verdict of one run, and running a
// binary with its output captured through a pipe.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <algorithm>

#include "common/json_file.h"
#include "common/user_error.h"
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

TEST(Selftest, ParsesTheGpuTestManifest) {
  const std::string text =
      "# name\tbinary relative to the build tree\tMPI ranks\n"
      "test_moe_cuda\ttests/moe/test_moe_cuda\t2\n"
      "\n"
      "attention_cuda_test\ttests/attention/attention_cuda_test\t0\n";
  const std::vector<GpuTest> t = parse_gpu_test_manifest(text, "/b");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "attention_cuda_test");  // sorted by name
  EXPECT_EQ(t[0].path, "/b/tests/attention/attention_cuda_test");
  EXPECT_EQ(t[0].mpi_ranks, 0);
  EXPECT_EQ(t[1].name, "test_moe_cuda");
  EXPECT_EQ(t[1].mpi_ranks, 2);
  EXPECT_TRUE(parse_gpu_test_manifest("# only a header\n", "/b").empty());
  auto refused = [](const std::string& row, const std::string& says) {
    try {
      parse_gpu_test_manifest("# h\n" + row + "\n", "/b");
      ADD_FAILURE() << "accepted: " << row;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
  };
  refused("a\tb", "want name<TAB>");
  refused("a\tb\t1\textra", "want name<TAB>");
  refused("\tb\t1", "want name<TAB>");
  refused("a\t/abs/a\t0", "absolute path");
  refused("a\tb\ttwo", "want a whole number from 0 to 64");
  refused("a\tb\t-1", "want a whole number from 0 to 64");
  refused("a\tb\t65", "want a whole number from 0 to 64");
  refused("a\tb\t", "want a whole number from 0 to 64");
}

// The manifest this build tree's CMake wrote lists every GPU test the build registered, each binary built when CUDA
// is on (a binary named there but not built would fail selftest with "cannot start").
TEST(Selftest, ThisBuildsManifestNamesBuiltBinaries) {
  const std::vector<GpuTest> t = read_gpu_tests(LCPLAN_BINARY_DIR);
#ifdef LCPLAN_TEST_HAVE_CUDA
  std::vector<std::string> names;
  for (const GpuTest& g : t) {
    names.push_back(g.name);
    EXPECT_EQ(::access(g.path.c_str(), X_OK), 0) << g.path;
  }
  // Two the old name-pattern scan missed: neither name contains "_cuda".
  for (const char* want : {"profiler_cupti_test", "test_comm_nccl", "executor_param_store_cuda_test", "test_moe_cuda"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const GpuTest& g : t) {
    if (g.name == "test_comm_nccl" || g.name == "test_moe_cuda") {
      EXPECT_EQ(g.mpi_ranks, 2) << g.name;
    }
  }
#else
  EXPECT_TRUE(t.empty());
#endif
}

TEST(Selftest, ReadRefusesABuildTreeWithoutAManifest) {
  const fs::path dir = fs::temp_directory_path() / ("lcplan_selftest_test." + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    read_gpu_tests(dir.string());
    ADD_FAILURE() << "accepted a tree without gpu_tests.tsv";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no gpu_tests.tsv"), std::string::npos) << e.what();
  }
  const std::string row = "x\tx\t0\n";
  write_file_atomic((dir / kGpuTestManifest).string(), row);
  EXPECT_EQ(read_gpu_tests(dir.string()).front().path, (dir / "x").string());
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
