// Validation against public measurements with the one shipped profile (data/calibration/default.json): the
// article's chunked-EP proxy and tuning path (implementation bumblebee), and every Megatron-Bridge row (implementation
// megatron), in sample and with the profile refitted without each model and each hardware.
//
// The thresholds are what the profile reaches today (README "Validation"), so a change that makes it worse fails;
// the targets that are not met (leave-one-model-out 15%, the article's a5 within 10%) are stated there.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "calibrate/validate.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/time_model.h"

namespace lcplan {
namespace {

std::vector<MeasuredCase> cases(const std::string& file, std::vector<Measurement>* not_modelled = nullptr) {
  std::vector<Measurement> all = load_measurements(data_dir() + "/data/validation/" + file);
  std::vector<Measurement> dropped;
  for (const Measurement& m : all)
    if (!m.not_modelled.empty()) dropped.push_back(m);
  auto out = resolve_measurements(all, data_dir(), &dropped);
  if (not_modelled) not_modelled->insert(not_modelled->end(), dropped.begin(), dropped.end());
  return out;
}

struct Fixture : ::testing::Test {
  Calibration profile = load_calibration("default", data_dir());
  Calibration priors = load_calibration("priors", data_dir());
};

// The article's chunked-EP speedup (2 chunks against 1) by local sequence: from 16K on within 6.5 points of the
// measured gain (64K is 6.1 under since the profile fits attention's head-dim-256 backward, 5.8 before); at 4K and 8K the estimate under-credits chunking (README Known gaps: with the grouped GEMMs at Megatron-LM's
// benchmarked rate the article's short layers have too little expert compute to hide a chunk's all-to-all behind).
TEST_F(Fixture, ChunkedEpProxySpeedupsGrowWithLocalSequence) {
  const auto all = cases("bumblebee-runs.json");
  std::printf("%-8s %12s %12s %10s %12s %12s %10s\n", "local", "meas_1(ms)", "meas_2(ms)", "meas_gain", "pred_1(ms)",
              "pred_2(ms)", "pred_gain");
  double prev = -1;
  int rows = 0;
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    const MeasuredCase& a = all[i];
    const MeasuredCase& b = all[i + 1];
    if (a.meas.scope != MeasurementScope::MoeLayer || a.meas.plan.moe.ep_chunks != 1 || b.meas.plan.moe.ep_chunks != 2) continue;
    const Calibration cal = calibration_for(profile, a.hw.name, a.meas.plan.implementation);
    const double m1 = *a.meas.step_seconds, m2 = *b.meas.step_seconds;
    const MoeLayerTime t1 = moe_layer_time(derive_plan(a.model, a.meas.plan, a.hw), a.hw, cal),
                       t2 = moe_layer_time(derive_plan(b.model, b.meas.plan, b.hw), b.hw, cal);
    const double p1 = t1.forward + t1.backward, p2 = t2.forward + t2.backward;
    const double mg = 1 - m2 / m1, pg = 1 - p2 / p1;  // the article's speedup: time saved / no-chunk time
    std::printf("%-8lld %12.3f %12.3f %9.2f%% %12.3f %12.3f %9.2f%%\n", (long long)a.meas.plan.seq_len, 1e3 * m1,
                1e3 * m2, 100 * mg, 1e3 * p1, 1e3 * p2, 100 * pg);
    ++rows;
    if (a.meas.plan.seq_len >= 16384) {
      EXPECT_NEAR(pg, mg, 0.065) << a.meas.id;
    }
    // From 8K on, chunking pays and pays more with longer local sequences (article section 2.4). At 4K the model
    // has each chunk pay its all-to-all call and launch costs and predicts a loss (README "Known gaps").
    if (a.meas.plan.seq_len >= 8192) {
      EXPECT_GT(pg, 0) << a.meas.id;
      EXPECT_GT(pg, prev - 0.01) << "predicted speedup must not fall with local sequence";
    }
    prev = pg;
  }
  EXPECT_EQ(rows, 5);
}

TEST_F(Fixture, TuningPathWithinElevenPercentAndPeaksOfFourRows) {
  std::vector<double> pred;
  for (const MeasuredCase& c : cases("bumblebee-runs.json")) {
    if (c.meas.scope != MeasurementScope::Step) continue;
    const double tf = predict(c, Quantity::TflopsPerGpu, profile);
    const double peak = predict(c, Quantity::PeakBytes, profile);
    std::printf("%-10s TFLOP/s/GPU measured %7.2f predicted %7.2f (%+.1f%%); stage-0 peak measured %6.2f GB predicted "
                "%6.2f GB (%+.1f%%)\n",
                c.meas.id.c_str(), *c.meas.tflops_per_gpu, tf, 100 * (tf / *c.meas.tflops_per_gpu - 1),
                *c.meas.peak_bytes / 1e9, peak / 1e9, 100 * (peak / *c.meas.peak_bytes - 1));
    // a5 lands at +11.0%: the model gives chunking a larger share of the step than a4 -> a5 shows (README).
    EXPECT_NEAR(tf / *c.meas.tflops_per_gpu, 1.0, c.meas.id == "tuning-a5" ? 0.115 : 0.11) << c.meas.id;
    // a4's 60.54 GB cannot be reached from a3's 47.03 GB by a PP change (README "Known gaps"); a5 is +12.7%.
    if (c.meas.id != "tuning-a4") {
      EXPECT_NEAR(peak / *c.meas.peak_bytes, 1.0, c.meas.id == "tuning-a5" ? 0.14 : 0.10) << c.meas.id;
    }
    pred.push_back(tf);
  }
  ASSERT_EQ(pred.size(), 5u);
  // The article's order, with linear CE and FSDP2 (+0.6% in the article, "essentially no throughput loss") equal
  // within 1%.
  EXPECT_LT(pred[0], pred[1]);
  EXPECT_NEAR(pred[2] / pred[1], 1.0, 0.01);
  EXPECT_LT(pred[2], pred[3]);
  EXPECT_LT(pred[3], pred[4]);
}

// The four long-context rows (Qwen3-235B-A22B, 256 H100, CP 1-8 at 16K-128K): measured TFLOPs/GPU rise with the
// sequence as attention's share grows, and so must the prediction; each row's error is printed.
TEST_F(Fixture, LongContextRowsRiseWithSequenceAsMeasured) {
  std::vector<double> pred, meas;
  for (const MeasuredCase& c : cases("megatron-moe-long-context-h100-runs.json")) {
    const double tf = predict(c, Quantity::TflopsPerGpu, profile);
    std::printf("%-10s seq %6lld cp %d TFLOP/s/GPU measured %6.1f predicted %6.1f (%+.1f%%)\n", c.meas.id.c_str(),
                (long long)c.meas.plan.seq_len, c.meas.plan.parallel.cp, *c.meas.tflops_per_gpu, tf,
                100 * (tf / *c.meas.tflops_per_gpu - 1));
    pred.push_back(tf);
    meas.push_back(*c.meas.tflops_per_gpu);
  }
  ASSERT_EQ(pred.size(), 4u);
  for (size_t i = 1; i < pred.size(); ++i) EXPECT_GT(pred[i], pred[i - 1]) << "row " << i;
}

// Every group (model, hardware, context band) against data/validation/recorded-errors.json: neither its in-sample nor
// its left-out error grows more than 2 points beyond the record (scripts/record_validation.py writes both the record
// and README's table, which must agree with it).
void expect_groups_hold_their_record(const ValidationReport& r) {
  const nlohmann::json rec = read_json_file(data_dir() + "/data/validation/recorded-errors.json", "record")["groups"];
  std::ifstream in(data_dir() + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::set<std::string> seen;
  for (const auto* groups : {&r.by_model, &r.by_hardware, &r.by_context})
    for (const GroupError& g : *groups) {
      seen.insert(g.group);
      ASSERT_TRUE(rec.contains(g.group)) << g.group << " is not recorded: run scripts/record_validation.py";
      const nlohmann::json& want = rec.at(g.group);
      EXPECT_LE(g.in_sample, want.at("in_sample").get<double>() + 0.02) << g.group << " in sample";
      if (!want.at("left_out").is_null()) {
        EXPECT_LE(g.out_of_sample, want.at("left_out").get<double>() + 0.02) << g.group << " left out of the fit";
      }
      char line[160];
      std::snprintf(line, sizeof line, "| %s | %d | %.1f%% |", g.group.c_str(), want.at("rows").get<int>(),
                    100 * want.at("in_sample").get<double>());
      EXPECT_NE(readme.find(line), std::string::npos) << "README's validation table lacks \"" << line << "\"";
    }
  for (const auto& [group, _] : rec.items()) EXPECT_TRUE(seen.count(group)) << group << " is recorded but not validated";
}

// One MoE layer against Megatron-LM's own benchmark of it (12 cases; times fitted, peaks checked): each case's time and max
// allocated error is printed and must not grow more than 2 points beyond what scripts/record_validation.py recorded
// (and README shows).
TEST_F(Fixture, MoeLayerBenchmarksHoldTheirRecord) {
  const nlohmann::json rec =
      read_json_file(data_dir() + "/data/validation/recorded-errors.json", "record")["moe_layer_benchmarks"]["cases"];
  std::ifstream in(data_dir() + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int n = 0;
  for (const MeasuredCase& c : cases("megatron-moe-layer-perf-h100-runs.json")) {
    ASSERT_EQ(c.meas.scope, MeasurementScope::MoeLayer) << c.meas.id;
    const double err = predict(c, Quantity::StepSeconds, profile) / *c.meas.step_seconds - 1;
    std::printf("%-5s %-30s %-5s measured %6.2f ms predicted %+7.1f%%\n", c.meas.id.c_str(),
                std::filesystem::path(c.model.name).stem().c_str(), to_string(c.meas.plan.precision),
                1e3 * *c.meas.step_seconds, 100 * err);
    ASSERT_TRUE(rec.contains(c.meas.id)) << c.meas.id << " is not recorded: run scripts/record_validation.py";
    const double want = rec.at(c.meas.id).at("error").get<double>();
    EXPECT_LE(std::fabs(err), std::fabs(want) + 0.02) << c.meas.id;
    // Its max allocated bytes against the estimate's terms for one MoE layer (weights, gradients, saved, buffers).
    ASSERT_TRUE(c.meas.peak_bytes.has_value()) << c.meas.id;
    const double peak_err = predict(c, Quantity::PeakBytes, profile) / *c.meas.peak_bytes - 1;
    std::printf("%-5s max allocated %.2f GB predicted %+7.1f%%\n", c.meas.id.c_str(), 1e-9 * *c.meas.peak_bytes,
                100 * peak_err);
    EXPECT_LE(std::fabs(peak_err), std::fabs(rec.at(c.meas.id).at("peak_error").get<double>()) + 0.02) << c.meas.id;
    char line[64];
    std::snprintf(line, sizeof line, "| %s |", c.meas.id.c_str());
    EXPECT_NE(readme.find(line), std::string::npos) << "README's MoE layer table lacks " << c.meas.id;
    ++n;
  }
  EXPECT_EQ(n, 12);
}

// The corpus CI validates: every file the default profile is fitted to (scripts/record_validation.py records them from
// scripts/fit_default_profile.sh), so each leave-one-group-out refit sees what the shipped fit saw but the group.
std::vector<std::string> corpus() {
  std::vector<std::string> files;
  const nlohmann::json rec = read_json_file(data_dir() + "/data/validation/recorded-errors.json", "record");
  for (const auto& f : rec.at("corpus")) files.push_back(std::filesystem::path(f.get<std::string>()).filename().string());
  return files;
}

ValidationReport validate_files(const std::vector<std::string>& files, const Calibration& profile,
                                const Calibration& priors, std::vector<Measurement>& not_modelled) {
  std::vector<MeasuredCase> all;
  for (const std::string& f : files) {
    auto c = cases(f, &not_modelled);
    all.insert(all.end(), c.begin(), c.end());
  }
  ValidateOptions opt;
  opt.source = "data/validation";
  return validate_profile(all, not_modelled, profile, priors, opt);
}

// The time band is a band of step-time residuals: a TFLOP/s row predicted 25% fast (too high a rate) is a step
// predicted 20% short, and an estimate whose validation ran 10-40% short expects the measured step 1.11-1.67x longer
// (and the rate 0.6-0.9x its own), not shorter.
TEST_F(Fixture, TheTimeBandIsInStepTimeAndWidensTheWayThePredictionsErr) {
  std::vector<MeasuredCase> one = cases("megatron-moe-long-context-h100-runs.json");
  one.resize(1);
  ASSERT_TRUE(one[0].meas.tflops_per_gpu.has_value());
  ValidateOptions opt;
  opt.refit = false;
  const ValidationReport r = validate_profile(one, {}, profile, priors, opt);
  ASSERT_EQ(r.rows.size(), 1u);
  const double rate_err = r.rows[0].error();
  EXPECT_NEAR(r.time_band.low, 1 / (1 + rate_err) - 1, 1e-12);
  EXPECT_NEAR(r.time_band.high, 1 / (1 + rate_err) - 1, 1e-12);

  const MeasuredCase& c = one[0];
  Calibration cal = calibration_for(profile, c.hw.name, c.meas.plan.implementation);
  cal.time_band = {-0.4, -0.1, 10, "test: steps predicted 10-40% short", {}};
  const Estimate e = estimate(c.model, c.meas.plan, c.hw, cal);
  EXPECT_NEAR(e.step_seconds_band.low, e.time.step_seconds / 0.9, 1e-9 * e.time.step_seconds);
  EXPECT_NEAR(e.step_seconds_band.high, e.time.step_seconds / 0.6, 1e-9 * e.time.step_seconds);
  EXPECT_NEAR(e.tflops_band.low, e.time.tflops_per_gpu * 0.6, 1e-9 * e.time.tflops_per_gpu);
  EXPECT_NEAR(e.tflops_band.high, e.time.tflops_per_gpu * 0.9, 1e-9 * e.time.tflops_per_gpu);
}

// The time band measures a new model on a framework the fit knew. Left out, the article's Qwen3.5 (the one model on
// bumblebee) takes bumblebee's coefficients with it, which measures a new framework: its rows are reported as a group
// but not banded. The band is the 10th-90th percentile of the Megatron-LM layer rows' left-out residuals alone.
TEST_F(Fixture, TheTimeBandLeavesOutAModelAloneOnItsFramework) {
  std::vector<MeasuredCase> all = cases("megatron-moe-layer-perf-h100-runs.json");
  const std::vector<MeasuredCase> article = cases("bumblebee-runs.json");
  all.insert(all.end(), article.begin(), article.end());
  ValidateOptions opt;
  opt.source = "test";
  const ValidationReport r = validate_profile(all, {}, profile, priors, opt);
  ASSERT_TRUE(r.refitted);
  std::vector<double> megatron;
  int bumblebee = 0;
  for (const ValidationRow& row : r.rows) {
    if (!row.fitted || row.quantity == Quantity::PeakBytes) continue;
    if (row.implementation == "bumblebee") ++bumblebee;
    else megatron.push_back(row.lomo_error());
  }
  ASSERT_EQ(megatron.size(), 12u);
  ASSERT_GT(bumblebee, 0);
  EXPECT_EQ(r.time_band.points, 12);
  EXPECT_EQ(r.time_band.frameworks, std::vector<std::string>{"megatron"});
  EXPECT_NE(r.time_band.source.find("whose framework other models also ran"), std::string::npos) << r.time_band.source;
  std::sort(megatron.begin(), megatron.end());
  auto at = [&](double q) {  // linear interpolation between order statistics, as validate's quantile
    const double pos = q * (megatron.size() - 1);
    const size_t i = size_t(pos);
    return megatron[i] + (pos - i) * (megatron[i + 1] - megatron[i]);
  };
  EXPECT_NEAR(r.time_band.low, at(0.1), 1e-12);
  EXPECT_NEAR(r.time_band.high, at(0.9), 1e-12);
  // Still reported: the group of the model left out with its framework.
  bool reported = false;
  for (const GroupError& g : r.by_model) reported |= g.group == "model qwen3.5-35b-a3b" && std::isfinite(g.out_of_sample);
  EXPECT_TRUE(reported);
}

// The corpus is every file the shipped profile is fitted to: a file fitted but not validated would leave its rows out
// of every refit, and the left-out errors would describe a fit that does not ship.
TEST_F(Fixture, TheCorpusIsWhatTheProfileIsFittedTo) {
  const std::string& fitted = profile.provenance.at("time.gemm_efficiency");
  ASSERT_EQ(fitted.rfind("fitted: ", 0), 0u) << fitted;
  const std::vector<std::string> files = corpus();
  size_t named = 0;
  for (size_t at = fitted.find("data/validation/"); at != std::string::npos; at = fitted.find("data/validation/", at + 1)) {
    const size_t end = fitted.find(".json", at);
    ASSERT_NE(end, std::string::npos) << fitted;
    const std::string file = fitted.substr(at + 16, end + 5 - at - 16);
    EXPECT_NE(std::find(files.begin(), files.end(), file), files.end()) << file << " is fitted but not validated";
    ++named;
  }
  EXPECT_EQ(named, files.size()) << fitted;
}

// The corpus CI validates (corpus()): in sample and leave one model / one hardware / one context band out, within the
// limits; the bands the shipped profile carries are computed here.
TEST_F(Fixture, FittedRowsHoldTheirLimits) {
  std::vector<Measurement> not_modelled;
  const ValidationReport r = validate_files(corpus(), profile, priors, not_modelled);
  EXPECT_GE(r.time_rows, 80);
  EXPECT_LE(r.time_in_sample, 0.11);
  EXPECT_LE(r.time_lomo, 0.21);
  EXPECT_LE(r.time_loho, 0.31);  // 29.9% with the layer benchmarks, 44% of them predicted without H100 (README)
  // Dense models generalize across models: the group errors the scoring cares most about.
  for (const GroupError& g : r.by_model)
    if (g.group.rfind("model llama", 0) == 0) {
      EXPECT_LE(g.out_of_sample, 0.10) << g.group;
    }
  EXPECT_NEAR(profile.time_band.low, r.time_band.low, 1e-6);
  EXPECT_NEAR(profile.time_band.high, r.time_band.high, 1e-6);
  EXPECT_EQ(profile.time_band.frameworks, r.time_band.frameworks);
}

// A band names the frameworks whose rows it holds and reads them back; a profile with a malformed list is refused, and
// a band that names none (an older profile) covers every framework.
TEST_F(Fixture, ABandNamesTheFrameworksItMeasured) {
  ASSERT_EQ(profile.time_band.frameworks, std::vector<std::string>{"megatron"});
  EXPECT_TRUE(profile.time_band.covers("megatron"));
  EXPECT_FALSE(profile.time_band.covers("bumblebee"));
  EXPECT_TRUE(ErrorBand{}.covers("bumblebee"));
  nlohmann::json j = calibration_to_json(profile);
  EXPECT_EQ(calibration_from_json(j, "copy").time_band.frameworks, profile.time_band.frameworks);
  j["validation"]["time"]["frameworks"] = "megatron";
  EXPECT_THROW(calibration_from_json(j, "copy"), UserError);
}

// Every visible row, the long-context rows included: answered, and each group (model,
// hardware, context band) holds its record, with each group's error printed.
TEST_F(Fixture, EveryVisibleRowIsAnsweredAndTheErrorsHold) {
  std::vector<Measurement> not_modelled;
  const ValidationReport r = validate_files(corpus(), profile, priors, not_modelled);
  std::fputs(validation_table(r).c_str(), stdout);
  // Rows that are not answered say why: LoRA runs, Mamba hybrids, and one impossible layout.
  for (const auto& [id, why] : r.not_modelled) EXPECT_FALSE(why.empty()) << id;
  EXPECT_LE(r.not_modelled.size(), 11u);
  for (const ValidationRow& row : r.rows) EXPECT_TRUE(std::isfinite(row.predicted) && row.predicted > 0) << row.id;
  EXPECT_GE(r.time_rows, 84);
  expect_groups_hold_their_record(r);
}

}  // namespace
}  // namespace lcplan
