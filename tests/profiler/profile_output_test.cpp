// Where a GPU profile writes what it measured (profiler/driver.cpp): vendor-library coefficients (cuBLAS GEMMs,
// copies) describe the hardware; lcplan's own kernels (attention, gated DeltaNet, linear CE) describe lcplan-exec on
// it, so a Megatron plan on that hardware keeps the published cuDNN prior. A CPU profile keeps everything per
// hardware (only lcplan-exec runs there).
#include <gtest/gtest.h>

#include "common/data_dir.h"
#include "common/json_file.h"
#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "profiler/driver.h"

namespace lcplan::profiler {
namespace {

Derived measured() {
  Derived d;
  d.coefficients["time.gemm_efficiency"] = {0.81, "cuBLAS fit"};
  Measured attn{0.0022, "our attention kernel fit"};
  attn.own_kernel = true;
  d.coefficients["time.attention_efficiency"] = attn;
  return d;
}

nlohmann::json written(const std::string& backend, const Hardware& hw) {
  ProfileRun run;
  run.data.backend = backend;
  return calibration_with_profile(read_json_file(data_dir() + "/data/calibration/default.json", "default profile"), hw, run, measured(),
                                  Targets{}, OutputFacts{"test device", "2026-11-27", "lcplan profile", "default"});
}

TEST(ProfileOutput, OwnKernelsDescribeTheExecutorOnAGpu) {
  const Hardware hw = load_hardware("h200", data_dir());
  const nlohmann::json j = written("cuda", hw);
  EXPECT_TRUE(j["per_hardware"]["h200"].contains("time.gemm_efficiency"));
  EXPECT_FALSE(j["per_hardware"]["h200"].contains("time.attention_efficiency"));
  const Calibration c = calibration_from_json(j, "test");
  const Calibration exec = calibration_for(c, "h200", "lcplan-exec");
  const Calibration megatron = calibration_for(c, "h200", "megatron");
  EXPECT_DOUBLE_EQ(exec.attention_efficiency, 0.0022);
  EXPECT_DOUBLE_EQ(exec.gemm_efficiency, 0.81);
  EXPECT_DOUBLE_EQ(megatron.gemm_efficiency, 0.81);
  EXPECT_GT(megatron.attention_efficiency, 0.1);  // the profile's prior, not our kernel
}

TEST(ProfileOutput, ACpuProfileKeepsEverythingPerHardware) {
  const Hardware hw = load_hardware("h200", data_dir());
  const nlohmann::json j = written("cpu", hw);
  EXPECT_TRUE(j["per_hardware"]["h200"].contains("time.attention_efficiency"));
  EXPECT_TRUE(j["per_hardware"]["h200"].contains("time.gemm_efficiency"));
}

}  // namespace
}  // namespace lcplan::profiler
