// lcplan selftest --gpu: on a GPU node, every CUDA kernel's test against its CPU reference on the device, then a
// short profile; pass/fail per kernel and the profile's path. Without a usable device it says so in one sentence
// on stderr and exits 77 ("skipped", the automake convention CTest's SKIP_RETURN_CODE reads), so scripts tell a
// machine without a GPU (77) from a failing kernel (1) and from bad input (2).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "common/user_error.h"
#include "profiler/device.h"
#include "profiler/selftest.h"

namespace lcplan {

namespace {

struct SelftestArgs {
  bool gpu = false;
  std::string build_dir, mpiexec, profile_out = "selftest-profile.json", timeout;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "lcplan";
}

int run_selftest(const SelftestArgs& a) {
  using namespace profiler;
  if (!a.gpu) throw UserError("selftest runs the GPU checks: give --gpu");
  const double timeout = a.timeout.empty() ? 600 : cli::parse_number(a.timeout, "--timeout", 1, 7200, "seconds, 1 to 7200");
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "lcplan: selftest --gpu skipped: %s\n", why.c_str());
    return 77;
  }
  const std::string dir = a.build_dir.empty() ? LCPLAN_SELFTEST_BUILD_DIR : a.build_dir;
  if (!std::filesystem::is_directory(dir))
    throw UserError("--build-dir \"" + dir + "\" is not a directory (give the build tree holding the CUDA tests)");
  const std::vector<GpuTest> tests = read_gpu_tests(dir);
  if (tests.empty())
    throw UserError("\"" + dir + "\" lists no CUDA tests in " + kGpuTestManifest +
                    " (build them with nvcc present: cmake --preset release && cmake --build build/release)");
  const std::string mpiexec = a.mpiexec.empty() ? LCPLAN_SELFTEST_MPIEXEC : a.mpiexec;
  int failed = 0;
  std::printf("selftest --gpu: %zu CUDA kernel tests from %s on %d device(s)\n", tests.size(), dir.c_str(), cuda_devices());
  for (const GpuTest& t : tests) {
    std::vector<std::string> argv;
    if (t.mpi_ranks > 0)
      argv = {mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(t.mpi_ranks), t.path};
    else
      argv = {t.path};
    // A binary the manifest lists but the build did not make fails here, with run_captured's "cannot start".
    const TestRun r = run_captured(argv, timeout);
    const Verdict v = classify(r.status, r.output);
    failed += v == Verdict::Fail;
    // A pass whose binary also skipped tests (a 2-rank test on a 1-GPU node runs only its device-free checks).
    const bool partly = v == Verdict::Pass && r.output.find("[  SKIPPED ]") != std::string::npos;
    std::printf("  %-8s %-40s %6.1f s%s\n", to_string(v), t.name.c_str(), r.seconds,
                r.status == 124                ? "  (timed out)"
                : v == Verdict::Skipped        ? "  (the test skipped itself)"
                : partly                       ? "  (some of its tests skipped themselves)"
                                               : "");
    if (v == Verdict::Fail) {
      const std::string& o = r.output;
      std::printf("%s\n", o.substr(o.size() > 4000 ? o.size() - 4000 : 0).c_str());
    }
    std::fflush(stdout);
  }
  // A short profile of the device: bf16/fp8 GEMMs, grouped GEMMs, attention, linear CE, MoE layer, copies, launch.
  const TestRun p = run_captured({self_exe(), "profile", "--backend", "cuda", "--quick", "--out", a.profile_out}, timeout);
  const bool profiled = p.status == 0;
  failed += !profiled;
  std::printf("  %-8s %-40s %6.1f s\n", profiled ? "pass" : "FAIL", "profile --backend cuda --quick", p.seconds);
  if (profiled) std::printf("profile written to %s\n", a.profile_out.c_str());
  else std::printf("%s\n", p.output.substr(p.output.size() > 4000 ? p.output.size() - 4000 : 0).c_str());
  std::printf("selftest --gpu: %s\n", failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}

}  // namespace

void register_selftest(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SelftestArgs>();
  auto* cmd = app.add_subcommand(cli::kSelftestCommand, cli::kSelftestAbout);
  cmd->add_flag("--gpu", a->gpu, "run the CUDA kernel tests and a short GPU profile (exit 77 when no device)");
  cmd->add_option("--build-dir", a->build_dir, "build tree holding the CUDA test binaries (default: the one lcplan was built in)");
  cmd->add_option("--mpiexec", a->mpiexec, "launcher of the multi-rank tests (default: the mpiexec lcplan was built with)");
  cmd->add_option("--profile-out", a->profile_out, "where the short profile goes (default: selftest-profile.json)");
  cmd->add_option("--timeout", a->timeout, "seconds per test binary and for the profile (default 600)");
  cmd->callback([a, &exit_code]() { exit_code = run_selftest(*a); });
}

}  // namespace lcplan
