// Measurement files: bad input gets one clear sentence; the fit refuses more coefficients than measured values.
#include <gtest/gtest.h>

#include "calibrate/calibrate_fit.h"
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
  s["scope"] = "moe_layer";
  EXPECT_NE(error_of(nlohmann::json::array({s})).find("step_seconds only"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("no measurements"), std::string::npos);
}

TEST(Measurement, FitRefusesMoreCoefficientsThanValues) {
  const auto cs = resolve_measurements(measurements_from_json(nlohmann::json::array({good()}), "runs.json"), data_dir());
  const Calibration start = load_calibration("megatron", data_dir());
  FitOptions opt;
  opt.keys = {"time.gemm_efficiency", "time.fp8_gemm_efficiency_ratio"};
  try {
    fit_calibration(cs, start, opt);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot fit 2 free coefficients to 1 measured values"), std::string::npos) << e.what();
  }
  opt.keys = {"time.bogus"};
  EXPECT_THROW(fit_calibration(cs, start, opt), UserError);
  opt.keys = {"time.kernels_per_layer"};  // a structural count, not fittable
  EXPECT_THROW(fit_calibration(cs, start, opt), UserError);
}

TEST(Measurement, FitRecoversAKnownCoefficient) {
  // Synthetic data from a known calibration: the fit must find the value it was generated with.
  Calibration truth = load_calibration("megatron", data_dir());
  truth.gemm_efficiency = 0.62;
  nlohmann::json runs = nlohmann::json::array();
  for (int seq : {2048, 8192}) {
    auto j = good();
    j["id"] = "s" + std::to_string(seq);
    j["plan"]["seq_len"] = seq;
    runs.push_back(j);
  }
  auto cs = resolve_measurements(measurements_from_json(runs, "runs.json"), data_dir());
  for (auto& c : cs) c.meas.tflops_per_gpu = predict(c, Quantity::TflopsPerGpu, truth);
  Calibration start = truth;
  start.gemm_efficiency = 0.4;
  FitOptions opt;
  opt.keys = {"time.gemm_efficiency"};
  const FitResult r = fit_calibration(cs, start, opt);
  EXPECT_NEAR(r.calibration.gemm_efficiency, 0.62, 1e-4);
  EXPECT_LT(r.mape, 1e-5);
  EXPECT_EQ(r.calibration.provenance.at("time.gemm_efficiency").rfind("fitted: 2 points", 0), 0u);
}

}  // namespace
}  // namespace lcplan
