// The tune loop (tune/tune_loop.h) without a cluster: the real search, estimator and fit, and "runs" that return the
// step time a hidden true calibration predicts (with a deterministic +-2% wobble, like repeated runs). Starting from
// a deliberately wrong calibration, the loop must learn the truth well enough that its predictions of the runs it
// made fall within 15% of what they measured, and choose the measured-fastest run; an interrupted tune resumed from
// its log must end where an uninterrupted one does.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "calibrate/calibrate_fit.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/hardware.h"
#include "models/zoo.h"
#include "search/search.h"
#include "tune/refit.h"
#include "tune/tune_hooks.h"
#include "tune/tune_log.h"
#include "tune/tune_loop.h"

namespace lcplan {
namespace {

const std::string kDir = LCPLAN_SOURCE_DIR;

struct World {
  ModelSpec model = load_model(kDir + "/tests/tune/tiny-moe.json", kDir);
  Hardware hw = load_hardware(kDir + "/tests/tune/cpu-4-ranks.json", kDir);
  Plan base;
  Calibration truth, start;
  std::vector<std::string> keys = {"time.gemm_efficiency", "time.attention_efficiency", "time.grouped_gemm_efficiency",
                                   "time.step_overhead_seconds"};
  World() {
    base.model = kDir + "/tests/tune/tiny-moe.json";
    base.hardware = kDir + "/tests/tune/cpu-4-ranks.json";
    base.gpus = 4;
    base.gpus_per_node = 4;
    base.seq_len = 1024;
    base.global_batch = 4;
    base.implementation = "lcplan-exec";
    Calibration flat = calibration_for(load_calibration("default", kDir), hw.name, "lcplan-exec");
    flat.per_hardware.clear();
    flat.per_implementation.clear();
    // The hidden machine has a framework's step overhead (lcplan-exec's own prior is 0): the fit has one to find.
    flat.step_overhead_seconds = load_calibration("default", kDir).step_overhead_seconds;
    // The truth this machine hides, and a start that is wrong by factors of 2-4 in every fitted coefficient.
    truth = flat;
    truth.gemm_efficiency *= 0.5;
    truth.attention_efficiency *= 0.6;
    truth.grouped_gemm_efficiency *= 0.7;
    truth.step_overhead_seconds *= 1.5;
    start = flat;
    start.gemm_efficiency = std::min(1.0, truth.gemm_efficiency * 3);
    start.attention_efficiency = truth.attention_efficiency / 2.5;
    start.grouped_gemm_efficiency = truth.grouped_gemm_efficiency / 3;
    start.step_overhead_seconds = truth.step_overhead_seconds * 4;
    tune_setup = setup();
  }

  MeasuredCase case_of(const Plan& p, double seconds, const std::string& id) const {
    MeasuredCase c;
    c.meas.id = id;
    c.meas.plan = p;
    c.meas.step_seconds = seconds;
    c.model = model_for_plan(model, p);
    c.hw = hw;
    return c;
  }

  // The tune's real hooks (tune/tune_hooks.h): the search ranks, the refit fits, predictions resolve the runs' plans;
  // only the runs are this hidden machine's.
  TuneSetup setup() const {
    TuneSetup s;
    s.model = model;
    s.hardware = hw;
    s.base = base;
    s.space = default_space(model, base);
    s.runnable = [](const Plan& p) { return p.parallel.tp == 1 && p.parallel.pp == 1; };
    s.refit.keys = keys;
    s.start = start;
    s.data_dir = kDir;
    return s;
  }

  TuneHooks hooks(std::function<void(int)> before_run = {}) const {
    TuneHooks h = make_tune_hooks(tune_setup);
    h.run = [this, before_run](const RankedPlan& p, int index) {
      if (before_run) before_run(index);
      const double wobble = 1 + 0.02 * std::sin(1.7 * index);  // repeated runs differ by a couple of percent
      TuneRun r;
      r.measured = case_of(p.plan, predict(case_of(p.plan, 1, "x"), Quantity::StepSeconds, truth) * wobble,
                           "run " + std::to_string(index)).meas;
      r.command = "synthetic";
      return r;
    };
    return h;
  }
  TuneSetup tune_setup;  // set last in the constructor: it reads base and start
};

double worst_error(const World& w, const TuneState& s, const TuneHooks& h) {
  double worst = 0;
  for (const TuneRun& r : s.runs)
    if (r.measured.step_seconds) worst = std::max(worst, std::abs(h.predict(r.measured, s.calibration) / *r.measured.step_seconds - 1));
  (void)w;
  return worst;
}

TEST(TuneLoop, LearnsAWrongCalibrationAndChoosesTheMeasuredFastest) {
  const World w;
  TuneState s;
  s.calibration = w.start;
  const TuneHooks h = w.hooks();
  TuneOptions opt;
  opt.plans_per_round = 3;
  opt.max_runs = 12;
  opt.max_rounds = 5;
  const TuneOutcome out = run_tune(s, h, opt);
  ASSERT_FALSE(s.runs.empty());
  ASSERT_FALSE(s.rounds.empty());
  // Before the first refit the start is far off; after the last the runs are predicted within 15%.
  EXPECT_GT(s.rounds.front().error_before, 0.3);
  EXPECT_LT(worst_error(w, s, h), 0.15) << "stopped: " << to_string(out.stop) << " after " << s.runs.size() << " runs";
  EXPECT_EQ(out.stop, TuneStop::Stable) << s.runs.size() << " runs";
  ASSERT_GT(out.chosen_run, 0);
  for (const TuneRun& r : s.runs)
    EXPECT_LE(*s.runs[size_t(out.chosen_run - 1)].measured.step_seconds, *r.measured.step_seconds);
  // No plan runs twice.
  std::set<std::string> keys;
  for (const TuneRun& r : s.runs) EXPECT_TRUE(keys.insert(r.ranked.key).second) << "run " << r.index << " repeats a plan";
}

TEST(TuneLoop, InterruptedTuneResumesFromItsLogToTheSameEnd) {
  const World w;
  TuneOptions opt;
  opt.plans_per_round = 2;
  opt.max_runs = 8;
  opt.tie = 0;  // no tolerance: the loop explores until the model orders the runs exactly as measured
  TuneState whole;
  whole.calibration = w.start;
  const TuneOutcome want = run_tune(whole, w.hooks(), opt);
  ASSERT_GE(whole.runs.size(), 4u) << "the uninterrupted tune must span two rounds for this test";

  // The first attempt fails when it starts run 4 (mid-round 2): the log holds runs 1-3 and round 1.
  const nlohmann::json request = {{"test", "resume"}};
  nlohmann::json log;
  TuneState first;
  first.calibration = w.start;
  TuneHooks failing = w.hooks([](int index) {
    if (index == 4) throw UserError("node lost");
  });
  failing.on_run = [&](const TuneState& s) { log = tune_log_json(request, s); };
  failing.on_round = failing.on_run;
  EXPECT_THROW(run_tune(first, failing, opt), UserError);
  ASSERT_EQ(first.runs.size(), 3u);

  TuneState resumed = tune_state_from_log(nlohmann::json::parse(log.dump()), request, "log.json");
  EXPECT_EQ(resumed.runs.size(), 3u);
  const TuneOutcome got = run_tune(resumed, w.hooks(), opt);
  EXPECT_EQ(got.stop, want.stop);
  EXPECT_EQ(got.chosen_run, want.chosen_run);
  ASSERT_EQ(resumed.runs.size(), whole.runs.size());
  for (size_t i = 0; i < whole.runs.size(); ++i) EXPECT_EQ(resumed.runs[i].ranked.key, whole.runs[i].ranked.key) << i;
  ASSERT_EQ(resumed.rounds.size(), whole.rounds.size());
  EXPECT_NEAR(resumed.calibration.gemm_efficiency, whole.calibration.gemm_efficiency, 1e-9);
}

TEST(TuneLoop, StopsAtTheBudget) {
  const World w;
  TuneState s;
  s.calibration = w.start;
  TuneOptions opt;
  opt.plans_per_round = 3;
  opt.max_runs = 2;
  const TuneOutcome out = run_tune(s, w.hooks(), opt);
  EXPECT_EQ(out.stop, TuneStop::Budget);
  EXPECT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.rounds.size(), 1u);
}

TEST(TuneLoop, APlanThatRanOutOfMemoryLeavesTheRankingAndIsNeverChosen) {
  const World w;
  TuneState s;
  s.calibration = w.start;
  TuneHooks h = w.hooks();
  const auto real_run = h.run;
  std::string oom_key;
  h.run = [&](const RankedPlan& p, int index) {
    if (index == 1) {  // the predicted best does not fit on the real machine
      oom_key = p.key;
      TuneRun r;
      r.measured.id = "run 1";
      r.measured.plan = p.plan;
      r.measured.status = MeasurementStatus::OutOfMemory;
      r.measured.failure = "CUDA out of memory";
      return r;
    }
    return real_run(p, index);
  };
  TuneOptions opt;
  opt.plans_per_round = 2;
  opt.max_runs = 6;
  const TuneOutcome out = run_tune(s, h, opt);
  ASSERT_GT(out.chosen_run, 1);
  for (const TuneRound& r : s.rounds)
    for (const RankedPlan& p : r.ranking) EXPECT_NE(p.key, oom_key) << "round " << r.round;
  for (size_t i = 1; i < s.runs.size(); ++i) EXPECT_NE(s.runs[i].ranked.key, oom_key);
}

TEST(TuneLog, RoundTripsAndRefusesAnotherRequest) {
  const World w;
  TuneState s;
  s.calibration = w.start;
  TuneOptions opt;
  opt.plans_per_round = 2;
  opt.max_runs = 4;
  const TuneOutcome out = run_tune(s, w.hooks(), opt);
  const nlohmann::json request = {{"base_plan", plan_to_json(w.base)}, {"plans_per_round", 2}};
  const nlohmann::json j = tune_log_json(request, s, out);
  EXPECT_EQ(j.at("stop"), to_string(out.stop));
  const TuneState back = tune_state_from_log(j, request, "log.json");
  ASSERT_EQ(back.runs.size(), s.runs.size());
  ASSERT_EQ(back.rounds.size(), s.rounds.size());
  EXPECT_EQ(tune_log_json(request, back, out), j);

  nlohmann::json other = request;
  other["plans_per_round"] = 3;
  try {
    tune_state_from_log(j, other, "log.json");
    FAIL() << "a log of another request was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("plans_per_round"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("log.json"), std::string::npos) << e.what();
  }
  nlohmann::json broken = j;
  broken["runs"][0]["index"] = 7;
  EXPECT_THROW(tune_state_from_log(broken, request, "log.json"), UserError);
  EXPECT_THROW(tune_state_from_log(nlohmann::json::object(), request, "log.json"), UserError);
}

}  // namespace
}  // namespace lcplan
