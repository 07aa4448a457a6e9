// `lcplan selftest --gpu`: every CUDA kernel test of the build tree against its CPU reference on the device, then a
// short profile. Discovery and the verdict of one test run are pure (tested without a GPU); running spawns the test
// binaries with their output read through a pipe.
#pragma once

#include <string>
#include <vector>

namespace lcplan::profiler {

struct GpuTest {
  std::string name;  // the CTest name, e.g. attention_cuda_test
  std::string path;  // the binary
  int mpi_ranks = 0; // > 0: run under mpirun -np mpi_ranks
};

// The manifest CMake writes into every build tree (cmake/lcplan_helpers.cmake lcplan_write_gpu_test_manifest): one
// row per test that lcplan_test registered with the gpu label.
constexpr const char* kGpuTestManifest = "gpu_tests.tsv";
// Rows "name<TAB>binary relative to the build tree<TAB>MPI ranks"; '#' lines and blank lines are skipped. Paths are
// joined to `build_dir`. Throws UserError naming the line when a row is malformed (three fields, a relative path,
// ranks 0 to 64). Pure: the binaries are not looked at.
std::vector<GpuTest> parse_gpu_test_manifest(const std::string& text, const std::string& build_dir);
// The manifest of `build_dir`, parsed; UserError when the build tree has none (configured before it existed).
std::vector<GpuTest> read_gpu_tests(const std::string& build_dir);

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
