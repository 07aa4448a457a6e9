// Measurement files: bad input gets one clear sentence; the fit refuses more coefficients than measured values.
#include <gtest/gtest.h>

#include "calibrate/measurement.h"
#include "common/data_dir.h"
#include "common/user_error.h"

namespace lcplan {
namespace {

nlohmann::json good() {
  return nlohmann::json::parse(R"({"id": "r1", "plan": {"model": "llama-3.1-8b", "gpus": 8, "seq_len": 8192},
                                    "tflops_per_gpu": 700})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    measurements_from_json(j, "runs.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Measurement, ParsesARecord) {
  const auto ms = measurements_from_json(nlohmann::json::array({good()}), "runs.json");
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].id, "r1");
  EXPECT_EQ(ms[0].plan.gpus, 8);
  EXPECT_DOUBLE_EQ(*ms[0].tflops_per_gpu, 700);
  EXPECT_FALSE(ms[0].peak_bytes.has_value());
}

TEST(Measurement, UnknownFieldIsNamed) {
  auto j = good();
  j["tflops"] = 1;
  EXPECT_NE(error_of(nlohmann::json::array({j})).find("unknown field \"tflops\""), std::string::npos);
  auto k = good();
  k["plan"]["tpp"] = 2;
  EXPECT_NE(error_of(nlohmann::json::array({k})).find("\"tpp\""), std::string::npos);
  EXPECT_NE(error_of({{"runs", nlohmann::json::array()}}).find("\"runs\""), std::string::npos);
}

TEST(Measurement, MissingValuesAreErrors) {
  auto j = good();
  j.erase("tflops_per_gpu");
  EXPECT_NE(error_of(nlohmann::json::array({j})).find("no measured value"), std::string::npos);
  auto k = good();
  k.erase("plan");
  EXPECT_NE(error_of(nlohmann::json::array({k})).find("\"plan\" is missing"), std::string::npos);
  auto n = good();
  n["step_seconds"] = -1;
  EXPECT_NE(error_of(nlohmann::json::array({n})).find("positive"), std::string::npos);
  auto s = good();
  s["scope"] = "moe_layer";  // a layer benchmark has no TFLOP/s per GPU and no pipeline stage
  EXPECT_NE(error_of(nlohmann::json::array({s})).find("takes step_seconds and, optionally, peak_bytes"),
            std::string::npos);
  s.erase("tflops_per_gpu");
  s["step_seconds"] = 0.01;
  s["peak_bytes"] = 3e9;
  EXPECT_EQ(error_of(nlohmann::json::array({s})), "");
  s["peak_stage"] = 0;
  EXPECT_NE(error_of(nlohmann::json::array({s})).find("peak_bytes"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("no measurements"), std::string::npos);
}

TEST(Measurement, SupersededNotModelledAndPeakStage) {
  auto j = good();
  j["superseded_by"] = "r2";
  j["peak_bytes"] = 5e10;
  j["peak_stage"] = 0;
  const auto ms = measurements_from_json(nlohmann::json::array({j}), "runs.json");
  EXPECT_EQ(ms[0].superseded_by, "r2");
  EXPECT_EQ(*ms[0].peak_stage, 0);
  auto c = good();
  c["memory_not_fitted"] = "the dispatcher's buffers";  // a reason for a peak it does not have
  EXPECT_NE(error_of(nlohmann::json::array({c})).find("has no peak_bytes"), std::string::npos);
  c["peak_bytes"] = 5e10;
  EXPECT_EQ(measurements_from_json(nlohmann::json::array({c}), "runs.json")[0].memory_not_fitted, "the dispatcher's buffers");
  EXPECT_EQ(measurement_to_json(measurements_from_json(nlohmann::json::array({c}), "runs.json")[0])["memory_not_fitted"],
            "the dispatcher's buffers");
  auto k = good();
  k["peak_stage"] = 3;  // the plan has pp 1
  EXPECT_NE(error_of(nlohmann::json::array({k})).find("pp - 1 = 0"), std::string::npos);
  auto n = good();
  n["not_modelled"] = "a Mamba hybrid";
  n["plan"]["model"] = "no-such-model";
  const auto nm = measurements_from_json(nlohmann::json::array({n}), "runs.json");
  std::vector<Measurement> impossible;
  EXPECT_TRUE(resolve_measurements(nm, data_dir(), &impossible).empty());  // not loaded, no error
  auto bad = good();
  bad["plan"]["parallel"] = {{"tp", 3}};
  std::vector<Measurement> refused;
  EXPECT_TRUE(resolve_measurements(measurements_from_json(nlohmann::json::array({bad}), "runs.json"), data_dir(), &refused).empty());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].not_modelled.rfind("impossible configuration: tp = 3", 0), 0u) << refused[0].not_modelled;
  EXPECT_THROW(resolve_measurements(measurements_from_json(nlohmann::json::array({bad}), "runs.json"), data_dir()), UserError);
}

}  // namespace
}  // namespace lcplan
