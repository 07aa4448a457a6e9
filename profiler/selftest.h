// `lcplan selftest --gpu`: every CUDA kernel test of the build tree against its CPU reference on the device, then a
// short profile. Discovery and the verdict of one test run are pure (tested without a GPU); running spawns the test
// binaries with their output read through a pipe.
#pragma once

#include <string>
#include <vector>

namespace lcplan::profiler {

struct GpuTest {
  std::string name;  // file name, e.g. attention_cuda_test
  std::string path;
  int mpi_ranks = 0; // > 0: run under mpirun -np mpi_ranks
};

// The CUDA test binaries under `build_dir` (recursively): executable regular files whose name ends in "_cuda_test"
// or "_cuda", or starts with "test_" and contains "_cuda" (test_moe_cuda, test_moe_kernels_cuda,
// linear_ce_cuda_vocab_parallel_test), sorted by name. The ones CTest runs under mpirun (their names are in
// mpi_test_ranks) get its rank count.
std::vector<GpuTest> find_gpu_tests(const std::string& build_dir);
// Ranks CTest runs a GPU test binary with (tests/*/CMakeLists.txt MPI_NP), 0 for a plain binary.
int mpi_test_ranks(const std::string& name);

enum class Verdict { Pass, Fail, Skipped };
const char* to_string(Verdict v);
// GoogleTest's output and exit status: non-zero exit (or a signal) fails; exit 0 with every test "[  SKIPPED ]"
// and none "[       OK ]" is skipped; else pass. `status` is the exit code, or 128 + signal.
Verdict classify(int status, const std::string& output);

struct TestRun {
  int status = -1;          // exit code, 128 + signal, or 124 on timeout
  std::string output;       // stdout and stderr interleaved
  double seconds = 0;
};
// Runs argv[0] with argv (no shell), capturing output, killing it after timeout_seconds.
TestRun run_captured(const std::vector<std::string>& argv, double timeout_seconds);

}  // namespace lcplan::profiler
