// `lcplan profile` end to end on the CPU backend: a short sweep writes a calibration profile and a hardware profile
// that `lcplan estimate` and `lcplan calibrate --start` use; the reference recipe's targeted profile finishes in
// under a minute; bad input gets one sentence and no file; SIGTERM / SIGINT during a case leaves no file; under
// mpirun only rank 0 writes and a rank count the plan cannot use fails on every rank.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "profiler/fit.h"
#include "tests/common/cli_runner.h"

namespace fs = std::filesystem;

namespace {

using lcplan::testing::Outcome;
using lcplan::testing::slurp;

const fs::path& scratch() { return lcplan::testing::scratch("lcplan_profile_test"); }

std::string path(const std::string& name) { return (scratch() / name).string(); }

// OpenMPI refuses root without these (CI runs as root).
lcplan::testing::RunOptions mpi_env() {
  lcplan::testing::RunOptions o;
  o.env = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  return o;
}

Outcome run(std::vector<std::string> args, const std::string& tag = "run") {
  args.insert(args.begin(), LCPLAN_BINARY);
  return lcplan::testing::finish_program(lcplan::testing::start_program(args, tag, mpi_env()), tag);
}

Outcome mpirun(int np, std::vector<std::string> args, const std::string& tag = "mpirun") {
  std::vector<std::string> a = {LCPLAN_MPIEXEC, "--oversubscribe", "-np", std::to_string(np), LCPLAN_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  return lcplan::testing::finish_program(lcplan::testing::start_program(a, tag, mpi_env()), tag);
}

// A sweep small enough for CI: every case, a few tiny shapes, one repeat.
std::vector<std::string> tiny(const std::string& out, const std::string& hw) {
  return {"profile", "--backend", "cpu", "--quick", "--repeat", "1", "--warmup", "0", "--out", out, "--hardware-out", hw,
          "--gemm-tokens", "16,64,256", "--gemm-shapes", "128x128,256x64", "--expert-tokens", "8,32,128", "--experts", "2",
          "--expert-hidden", "128", "--expert-ffn", "64", "--attention-seqs", "64,128,256", "--attention-heads", "2:1",
          "--head-dim", "32", "--linear-attention-seqs", "64,128", "--ce-tokens", "64", "--ce-hidden", "64",
          "--ce-vocab", "1024", "--ce-tiles", "256", "--moe-tokens", "64", "--moe-chunks", "1,2", "--min-bytes", "1k",
          "--max-bytes", "64k", "--step-factor", "8"};
}

std::string reference_plan() {
  const std::string p = path("reference.json");
  if (!fs::exists(p))
    lcplan::write_file_atomic(p, R"({"model": "qwen3.5-35b-a3b", "gpus": 32, "gpus_per_node": 8, "seq_len": 131072,
      "parallel": {"tp": 1, "pp": 1, "cp": 4, "ep": 8}, "optimizer_sharding": "fsdp", "recompute": "full",
      "linear_ce": true, "moe": {"ep_chunks": 2}})");
  return p;
}

void expect_one_sentence(const Outcome& r, const std::string& what) {
  EXPECT_NE(r.status, 0) << what;
  EXPECT_LT(r.status, 128) << what << ": killed by a signal";
  EXPECT_NE(r.status, 3) << what << ": an internal error";
  ASSERT_FALSE(r.err.empty()) << what;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << what << ": more than one line:\n" << r.err;
  EXPECT_EQ(r.err.rfind("lcplan: error: ", 0), 0u) << what << ": " << r.err;
  EXPECT_EQ(r.out, "") << what;
}

TEST(ProfileCli, CpuSweepFeedsEstimateAndCalibrate) {
  const std::string out = path("cpu.json"), hw = path("cpu-hw.json");
  const Outcome r = run(tiny(out, hw));
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  const nlohmann::json h = lcplan::read_json_file(hw, "hw");
  const std::string name = h.at("name");
  EXPECT_EQ(name.rfind("cpu-", 0), 0u);
  EXPECT_EQ(h.at("gpus_per_node"), 1);
  EXPECT_EQ(h.at("peak_bf16_flops"), h.at("peak_fp8_flops"));
  const nlohmann::json p = lcplan::read_json_file(out, "profile");
  ASSERT_TRUE(p.at("per_hardware").contains(name));
  const auto& coeffs = p.at("per_hardware").at(name);
  for (const char* k : {"time.gemm_efficiency", "time.gemm_half_tokens", "time.grouped_gemm_efficiency",
                        "time.grouped_gemm_half_tokens", "time.attention_efficiency", "time.attention_half_seq",
                        "time.linear_attention_efficiency", "time.hbm_efficiency", "time.launch_seconds",
                        "time.linear_ce_slowdown"}) {
    ASSERT_TRUE(coeffs.contains(k)) << k;
    EXPECT_EQ(coeffs.at(k).at("provenance").get<std::string>().rfind("measured: ", 0), 0u) << k;
    EXPECT_GE(coeffs.at(k).at("value").get<double>(), 0) << k;
  }
  // The written coefficients are the fit of the written table against the written peak: refitting the profile's own
  // GEMM rows (profiler/fit.h) gives the profile's GEMM efficiency and half point.
  std::vector<double> gx, gy;
  for (const auto& g : p.at("profile").at("tables").at("gemm"))
    if (g.at("type") != "fp8")
      gx.push_back(g.at("m").get<double>()),
          gy.push_back(g.at("flops_per_second").get<double>() / h.at("peak_bf16_flops").get<double>());
  const lcplan::profiler::CurveFit f = lcplan::profiler::fit_saturating(gx, gy);
  EXPECT_NEAR(coeffs.at("time.gemm_efficiency").at("value").get<double>(), f.max, 1e-9 * f.max);
  EXPECT_NEAR(coeffs.at("time.gemm_half_tokens").at("value").get<double>(), f.half, 1e-6 * (1 + f.half));
  EXPECT_FALSE(p.at("profile").at("tables").at("gemm").empty());
  EXPECT_FALSE(p.at("profile").at("tables").at("moe_layer").empty());
  EXPECT_EQ(p.at("profile").at("backend"), "cpu");
  // The default profile's own coefficients came along unchanged.
  EXPECT_TRUE(p.at("per_hardware").contains("h100-sxm-80gb"));
  EXPECT_TRUE(p.contains("validation"));

  const Outcome e = run({"estimate", "--calibration", out, "--hardware", hw, "--model", "qwen3.5-35b-a3b", "--gpus", "8",
                         "--seq", "32k", "--ep", "8", "--fsdp", "--recompute", "full", "--linear-ce", "--ep-chunks", "2",
                         "--implementation", "lcplan-exec"}, "estimate");
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.out.find("Time per step:"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find(name), std::string::npos);

  const std::string cal = path("calibrated.json");
  const Outcome c = run({"calibrate", "--start", out, "--measurements",
                         std::string(LCPLAN_SOURCE_DIR) + "/data/validation/bumblebee-runs.json", "--out", cal, "--no-loo",
                         "--fit", "memory.fragmentation"}, "calibrate");
  ASSERT_EQ(c.status, 0) << c.err;
  const nlohmann::json cj = lcplan::read_json_file(cal, "calibrated");
  EXPECT_EQ(cj.at("per_hardware").at(name).at("time.gemm_efficiency"), coeffs.at("time.gemm_efficiency"));
  EXPECT_TRUE(cj.contains("profile"));
}

TEST(ProfileCli, ReferencePlanOnOneRank) {
  const std::string out = path("plan.json"), hw = path("plan-hw.json");
  const Outcome r = run({"profile", "--plan", reference_plan(), "--backend", "cpu", "--quick", "--out", out,
                         "--hardware-out", hw}, "plan");
  ASSERT_EQ(r.status, 0) << r.err << r.out;  // its time (under a minute) is bench/record.sh's to measure
  const nlohmann::json p = lcplan::read_json_file(out, "profile");
  EXPECT_NE(p.at("profile").at("plan").get<std::string>().find("EP8"), std::string::npos);
  bool stated = false;  // shrunk shapes are stated in the output
  for (const auto& n : p.at("profile").at("notes")) stated |= n.get<std::string>().find("CPU budget") != std::string::npos;
  EXPECT_TRUE(stated);
  // The plan's own shapes: 32 experts per rank in the MoE layer, chunk counts 1 and 2.
  const auto& moe = p.at("profile").at("tables").at("moe_layer");
  ASSERT_FALSE(moe.empty());
  EXPECT_EQ(moe.front().at("experts"), 32);
  EXPECT_EQ(moe.back().at("chunks"), 2);
}

// Whether this lcplan can use a CUDA device (selftest exits 77 when it cannot, before looking at the build tree).
bool device_here() {
  static const bool here = run({"selftest", "--gpu", "--build-dir", scratch().string()}, "probe").status != 77;
  return here;
}

struct Bad {
  std::string what;
  std::vector<std::string> args;
  std::string mention;
};

TEST(ProfileCli, BadInputGetsOneSentenceAndNoFile) {
  const std::string out = path("never.json"), hw = path("never-hw.json");
  const std::string fp8 = path("fp8.json");
  lcplan::write_file_atomic(fp8, R"({"model": "qwen3.5-35b-a3b", "gpus": 8, "seq_len": 4096, "precision": "fp8",
    "parallel": {"ep": 8}})");
  auto cpu = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"profile", "--backend", "cpu", "--out", out, "--hardware-out", hw};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::vector<Bad> table = {
      {"fp8 plan on the CPU", cpu({"--plan", fp8}), "fp8"},
      {"cuda without a device", {"profile", "--backend", "cuda", "--out", out}, "--backend cuda"},
      {"unknown backend", {"profile", "--backend", "tpu", "--out", out}, "tpu"},
      {"CPU without a hardware profile", {"profile", "--backend", "cpu", "--out", out}, "--hardware-out"},
      {"GPU hardware for the CPU", {"profile", "--backend", "cpu", "--hardware", "h100-sxm-80gb", "--out", out},
       "h100-sxm-80gb"},
      {"both --hardware and --hardware-out", cpu({"--hardware", "h100-sxm-80gb"}), "--hardware"},
      {"unknown case", cpu({"--cases", "gemm,bogus"}), "bogus"},
      {"hardware profile without the gemm case", cpu({"--cases", "copy"}), "gemm"},
      {"max below min bytes", cpu({"--min-bytes", "1M", "--max-bytes", "1k"}), "--max-bytes"},
      {"shape without x", cpu({"--gemm-shapes", "128"}), "--gemm-shapes"},
      {"too many chunks", cpu({"--moe-chunks", "1,5"}), "--moe-chunks"},
      {"zero repeats", cpu({"--repeat", "0"}), "--repeat"},
      {"bad token list", cpu({"--gemm-tokens", "64,,128"}), "--gemm-tokens"},
      {"missing plan file", cpu({"--plan", path("no_such_plan.json")}), "no_such_plan.json"},
      {"out in a missing directory", {"profile", "--backend", "cpu", "--out", path("missing/p.json"), "--hardware-out", hw},
       "missing"},
      {"same file twice", {"profile", "--backend", "cpu", "--out", out, "--hardware-out", out}, "--hardware-out"},
      {"selftest without --gpu", {"selftest"}, "--gpu"},
  };
  for (const Bad& b : table) {
    if (b.what == "cuda without a device" && device_here()) continue;
    const Outcome r = run(b.args, "bad");
    expect_one_sentence(r, b.what);
    EXPECT_NE(r.err.find(b.mention), std::string::npos) << b.what << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << b.what;
    EXPECT_FALSE(fs::exists(hw)) << b.what;
  }
}

TEST(ProfileCli, SelftestWithoutADeviceIsSkipped) {
  const Outcome r = run({"selftest", "--gpu"}, "selftest");
  if (r.status != 77) GTEST_SKIP() << "a CUDA device is usable here; the selftest ran: " << r.out;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("lcplan: selftest --gpu skipped: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1);
}

// SIGTERM or SIGINT while a case runs: the process ends and no profile (nor hardware profile) exists.
void interrupt_during_a_case(int sig) {
  const std::string out = path("killed.json"), hw = path("killed-hw.json");
  const std::string tag = "killed" + std::to_string(sig);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = lcplan::testing::start_program({LCPLAN_BINARY, "profile", "--backend", "cpu", "--out", out,
                                                   "--hardware-out", hw, "--repeat", "1000", "--cases", "gemm,copy"},
                                                  tag, mpi_env());
  // Wait until the first point of the first case has been timed (the profile is mid-case), then interrupt it.
  bool running = false;
  while (!running && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    running = slurp(scratch() / (tag + ".out")).find("[profile] gemm") != std::string::npos;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, sig);
  const Outcome r = lcplan::testing::finish_program(pid, tag);
  ASSERT_TRUE(running) << "the profile never started a case: " << r.err;
  EXPECT_EQ(r.status, 128 + sig) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(hw));
  for (const auto& e : fs::directory_iterator(scratch()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(ProfileCli, SigtermDuringACaseLeavesNoFile) { interrupt_during_a_case(SIGTERM); }
TEST(ProfileCli, SigintDuringACaseLeavesNoFile) { interrupt_during_a_case(SIGINT); }

TEST(ProfileMpi, TwoRanksMeasureCollectivesAndOverlapAndRankZeroWrites) {
  const std::string out = path("mpi.json"), hw = path("mpi-hw.json");
  std::vector<std::string> a = tiny(out, hw);
  a.push_back("--cases");
  a.push_back("gemm,moe_layer,collectives,copy");
  const Outcome r = mpirun(2, a);
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  // One summary: only rank 0 prints and writes.
  size_t wrote = 0;
  for (size_t i = r.out.find("wrote "); i != std::string::npos; i = r.out.find("wrote ", i + 1)) ++wrote;
  EXPECT_EQ(wrote, 2u) << r.out;
  const nlohmann::json p = lcplan::read_json_file(out, "profile");
  const nlohmann::json h = lcplan::read_json_file(hw, "hw");
  EXPECT_EQ(h.at("gpus_per_node"), 2);
  const auto& coeffs = p.at("per_hardware").at(h.at("name").get<std::string>());
  // Fitted from wall times: on a loaded host the tiny sizes may not grow with size, and then the profile says so
  // (a note) instead of writing a coefficient; either way the rows were measured and read.
  std::string notes;
  for (const auto& n : p.at("profile").at("notes")) notes += n.get<std::string>() + "\n";
  for (const auto& [k, why] : {std::pair{"time.nvlink_latency", "intra-node ring collectives not fitted"},
                               std::pair{"time.nvlink_efficiency", "intra-node ring collectives not fitted"},
                               std::pair{"time.a2a_nvlink_efficiency", "intra-node all-to-all not fitted"}})
    EXPECT_TRUE(coeffs.contains(k) || notes.find(why) != std::string::npos) << k << "\n" << notes;
  bool overlapped = false, serial = false;
  for (const auto& row : p.at("profile").at("tables").at("moe_layer")) {
    EXPECT_EQ(row.at("ranks"), 2);
    const double ov = row.at("forward_streams").at("overlap");
    EXPECT_GE(ov, 0);
    EXPECT_LE(ov, 1);
    if (!row.at("overlap").get<bool>()) {
      serial = true;
      EXPECT_EQ(ov, 0);  // every all-to-all waited on at once
    }
    if (row.at("chunks") == 2 && row.at("overlap").get<bool>()) overlapped = row.at("forward_streams").at("comm_busy") > 0;
  }
  EXPECT_TRUE(serial);
  EXPECT_TRUE(overlapped);
}

TEST(ProfileMpi, RankCountThePlanCannotUseFailsOnEveryRank) {
  const std::string out = path("mpi-bad.json"), hw = path("mpi-bad-hw.json");
  // The reference plan places 8 GPUs on a node: 2 ranks are fewer than a node.
  const Outcome few = mpirun(2, {"profile", "--plan", reference_plan(), "--backend", "cpu", "--out", out,
                                 "--hardware-out", hw}, "few");
  EXPECT_NE(few.status, 0);
  EXPECT_NE(few.err.find("fewer than a node"), std::string::npos) << few.err;
  EXPECT_EQ(few.err.find("lcplan: error: "), few.err.rfind("lcplan: error: ")) << "printed once: " << few.err;
  // A one-GPU plan launched on 2 ranks: more than it needs.
  const std::string one = path("one-gpu.json");
  lcplan::write_file_atomic(one, R"({"model": "qwen3.5-35b-a3b", "gpus": 1, "seq_len": 4096})");
  const Outcome many = mpirun(2, {"profile", "--plan", one, "--backend", "cpu", "--out", out, "--hardware-out", hw}, "many");
  EXPECT_NE(many.status, 0);
  EXPECT_NE(many.err.find("more than it needs"), std::string::npos) << many.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(hw));
}

}  // namespace
