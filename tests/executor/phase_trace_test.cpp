// The executor's phase segments: per-step totals, waits and the Chrome trace (executor/phase_trace.h) on synthetic
// segments, and on a 4-rank interleaved pipeline run: every rank's segments follow its stage's schedule
// (executor/schedule.h) in order, on a clock that only moves forward, sum to the per-phase seconds the record
// reports, and are exactly what the on_phase hook saw; each stage-to-stage receive is a wait inside its phase, and
// the record's pipeline wait is the least any rank waited, which `lcplan validate` sets beside the estimator's bubble;
// a loss phase on the last stage only is recorded though the peak rank is elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "calibrate/validate_run.h"
#include "common/user_error.h"
#include "executor/phase_trace.h"
#include "executor/record.h"
#include "executor/schedule.h"
#include "kernels/comm/helpers.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

PhaseMark mark(Phase p, bool begin, int mb, int v, double t, int step = 1) { return {p, begin, step, mb, v, t}; }

// The on_phase hook's marks paired into segments, in order: what the executor's hook contract promises a consumer
// (begin, then the same segment's end). Throws std::invalid_argument on a mark that breaks it.
std::vector<PhaseSegment> pair_marks(const std::vector<PhaseMark>& marks) {
  std::vector<PhaseSegment> out;
  bool open = false;
  PhaseSegment cur;
  for (size_t i = 0; i < marks.size(); ++i) {
    const PhaseMark& m = marks[i];
    const std::string where = "phase mark " + std::to_string(i) + " (" + to_string(m.phase) + ", step " +
                              std::to_string(m.step) + ")";
    if (m.begin) {
      if (open) throw std::invalid_argument(where + " begins while the " + to_string(cur.phase) + " phase is open");
      cur = PhaseSegment{m.phase, m.step, m.microbatch, m.vstage, m.seconds, m.seconds};
      open = true;
    } else {
      if (!open || cur.phase != m.phase || cur.step != m.step || cur.microbatch != m.microbatch ||
          cur.vstage != m.vstage)
        throw std::invalid_argument(where + " ends a segment that is not the open one");
      if (m.seconds < cur.start) throw std::invalid_argument(where + " ends before it began");
      cur.end = m.seconds;
      out.push_back(cur);
      open = false;
    }
  }
  if (open) throw std::invalid_argument(std::string("the last ") + to_string(cur.phase) + " segment is never ended");
  return out;
}


TEST(PairMarks, PairsInOrderAndSumsPerPhase) {
  const std::vector<PhaseMark> marks = {
      mark(Phase::Forward, true, 0, 0, 1.0),  mark(Phase::Forward, false, 0, 0, 1.5),
      mark(Phase::Loss, true, 0, -1, 1.5),    mark(Phase::Loss, false, 0, -1, 1.75),
      mark(Phase::Backward, true, 0, 0, 2.0), mark(Phase::Backward, false, 0, 0, 3.0),
      mark(Phase::Forward, true, 1, 0, 3.0),  mark(Phase::Forward, false, 1, 0, 3.25),
      mark(Phase::Optimizer, true, -1, -1, 4.0), mark(Phase::Optimizer, false, -1, -1, 4.5)};
  std::vector<PhaseSegment> s = pair_marks(marks);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[1].phase, Phase::Loss);
  EXPECT_EQ(s[3].microbatch, 1);
  EXPECT_DOUBLE_EQ(s[2].start, 2.0);
  EXPECT_DOUBLE_EQ(s[2].end, 3.0);
  const auto t = phase_totals(s, 1);
  EXPECT_DOUBLE_EQ(t[size_t(Phase::Forward)], 0.75);
  EXPECT_DOUBLE_EQ(t[size_t(Phase::Loss)], 0.25);
  EXPECT_DOUBLE_EQ(t[size_t(Phase::Backward)], 1.0);
  EXPECT_DOUBLE_EQ(t[size_t(Phase::Optimizer)], 0.5);
  // A wait inside the backward is part of its phase's time, not added to it.
  s.push_back({Phase::Backward, 1, 0, 0, 2.25, 2.5, true});
  s.push_back({Phase::Backward, 2, 0, 0, 5.0, 6.0, true});
  EXPECT_DOUBLE_EQ(phase_totals(s, 1)[size_t(Phase::Backward)], 1.0);
  EXPECT_DOUBLE_EQ(phase_totals(s, 2)[size_t(Phase::Backward)], 0.0);  // step 2 has a wait only
  EXPECT_DOUBLE_EQ(pipeline_wait_seconds(s, 1), 0.25);
  EXPECT_DOUBLE_EQ(pipeline_wait_seconds(s, 2), 1.0);
  EXPECT_DOUBLE_EQ(pipeline_wait_seconds(s, 3), 0.0);
  double packed[kSegmentDoubles];
  pack_segment(s[2], packed);
  const PhaseSegment back = unpack_segment(packed);
  EXPECT_EQ(back.phase, s[2].phase);
  EXPECT_EQ(back.step, s[2].step);
  EXPECT_EQ(back.microbatch, s[2].microbatch);
  EXPECT_EQ(back.vstage, s[2].vstage);
  EXPECT_EQ(back.start, s[2].start);
  EXPECT_EQ(back.end, s[2].end);
  EXPECT_FALSE(back.wait);
  pack_segment(s.back(), packed);
  EXPECT_TRUE(unpack_segment(packed).wait);
}

TEST(PairMarks, RefusesUnbalancedMarks) {
  // Begun while another is open.
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 1), mark(Phase::Loss, true, 0, -1, 2)}),
               std::invalid_argument);
  // Ended without being begun, or ending another segment (phase, microbatch or virtual stage differ).
  EXPECT_THROW(pair_marks({mark(Phase::Forward, false, 0, 0, 1)}), std::invalid_argument);
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 1), mark(Phase::Backward, false, 0, 0, 2)}),
               std::invalid_argument);
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 1), mark(Phase::Forward, false, 1, 0, 2)}),
               std::invalid_argument);
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 1), mark(Phase::Forward, false, 0, 1, 2)}),
               std::invalid_argument);
  // Ending before it began, and left open.
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 2), mark(Phase::Forward, false, 0, 0, 1)}),
               std::invalid_argument);
  EXPECT_THROW(pair_marks({mark(Phase::Forward, true, 0, 0, 1)}), std::invalid_argument);
  EXPECT_TRUE(pair_marks({}).empty());
}

TEST(PhaseTraceJson, OneProcessPerRankOneCompleteEventPerSegment) {
  const std::vector<std::vector<PhaseSegment>> per_rank = {
      {{Phase::Forward, 1, 0, 0, 0.001, 0.003}, {Phase::Optimizer, 1, -1, -1, 0.004, 0.0045}},
      {{Phase::Forward, 1, 0, 1, 0.003, 0.005}, {Phase::Loss, 1, 0, -1, 0.005, 0.006},
       {Phase::Forward, 1, 0, 1, 0.003, 0.004, true}}};
  const nlohmann::json j = phase_trace_json(per_rank, {0, 1});
  const nlohmann::json& ev = j.at("traceEvents");
  ASSERT_EQ(ev.size(), 2u * 2 + 5);  // name and sort index per rank, one event per segment
  int complete = 0;
  for (const nlohmann::json& e : ev) {
    if (e.at("ph") == "M") continue;
    ++complete;
    EXPECT_EQ(e.at("tid"), 0);
    EXPECT_GE(e.at("dur").get<double>(), 0);
  }
  EXPECT_EQ(complete, 5);
  EXPECT_EQ(ev[0].at("args").at("name"), "rank 0 (stage 0)");
  EXPECT_EQ(ev[2].at("name"), "forward mb 0 v0");
  EXPECT_NEAR(ev[2].at("ts").get<double>(), 1000.0, 1e-9);  // microseconds
  EXPECT_NEAR(ev[2].at("dur").get<double>(), 2000.0, 1e-9);
  EXPECT_EQ(ev[3].at("name"), "optimizer");
  EXPECT_EQ(ev[4].at("args").at("name"), "rank 1 (stage 1)");
  EXPECT_EQ(ev[7].at("name"), "loss mb 0");
  EXPECT_EQ(ev[7].at("args").at("microbatch"), 0);
  EXPECT_EQ(ev[8].at("name"), "wait for activations mb 0 v1");
  EXPECT_EQ(ev[8].at("args").at("wait"), true);
  EXPECT_THROW(phase_trace_json(per_rank, {0}), std::invalid_argument);
}

// Llama-3.1-8B scaled 64x, 8 layers, PP 4 with 2 virtual stages each, 8 microbatches, 2 steps.
TEST(PhaseSegments, FollowTheScheduleOnEveryRank) {
  helpers::World w;
  if (w.c.size != 4) GTEST_SKIP() << "needs 4 ranks";
  const PlanArgs a{.gpus = 4, .global_batch = 8, .pp = 4, .vpp = 2, .seq = 4096, .sharding = OptimizerSharding::DistOpt};
  const ScaledCase sc = executor_case(zoo("llama-3.1-8b"), make_plan("llama-3.1-8b", a), {64, 8});
  ExecOptions o;
  o.steps = 2;
  o.gather_segments = true;
  std::vector<PhaseMark> seen;
  o.on_phase = [&seen](const PhaseMark& m) { seen.push_back(m); };
  const ExecResult r = run_case(w.c, sc, o);
  ASSERT_EQ(r.segments.size(), 4u);
  ASSERT_EQ(r.microbatches, 8);
  const int pp = 4, vpp = 2;
  for (int rank = 0; rank < 4; ++rank) {
    const int stage = r.ranks[size_t(rank)].stage;
    // The expected order: each schedule action, the loss after the last virtual stage's forward, then the optimizer.
    std::vector<PhaseSegment> want;
    for (int step = 1; step <= 2; ++step) {
      for (const PipeAction& act : pipeline_schedule(pp, vpp, stage, r.microbatches)) {
        const int v = act.chunk * pp + stage;
        want.push_back({act.forward ? Phase::Forward : Phase::Backward, step, act.microbatch, v, 0, 0});
        if (act.forward && v == pp * vpp - 1) want.push_back({Phase::Loss, step, act.microbatch, -1, 0, 0});
      }
      want.push_back({Phase::Optimizer, step, -1, -1, 0, 0});
    }
    std::vector<PhaseSegment> got, waits;
    for (const PhaseSegment& sg : r.segments[size_t(rank)]) (sg.wait ? waits : got).push_back(sg);
    ASSERT_EQ(got.size(), want.size()) << "rank " << rank;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].phase, want[i].phase) << "rank " << rank << " segment " << i;
      EXPECT_EQ(got[i].step, want[i].step) << "rank " << rank << " segment " << i;
      EXPECT_EQ(got[i].microbatch, want[i].microbatch) << "rank " << rank << " segment " << i;
      EXPECT_EQ(got[i].vstage, want[i].vstage) << "rank " << rank << " segment " << i;
      EXPECT_LE(got[i].start, got[i].end);
      if (i > 0) {
        EXPECT_GE(got[i].start, got[i - 1].end) << "rank " << rank << " segment " << i;
      }
    }
    // One wait per stage-to-stage receive (every forward but virtual stage 0's, every backward but the last
    // virtual stage's) and one per step in the optimizer, each inside the segment it belongs to.
    size_t receives = 2;
    for (const PhaseSegment& sg : got)
      receives += (sg.phase == Phase::Forward && sg.vstage > 0) || (sg.phase == Phase::Backward && sg.vstage < pp * vpp - 1);
    EXPECT_EQ(waits.size(), receives) << "rank " << rank;
    for (const PhaseSegment& wt : waits) {
      int inside = 0;
      for (const PhaseSegment& sg : got)
        inside += sg.phase == wt.phase && sg.step == wt.step && sg.microbatch == wt.microbatch &&
                  sg.vstage == wt.vstage && sg.start <= wt.start && wt.start <= wt.end && wt.end <= sg.end;
      EXPECT_EQ(inside, 1) << "rank " << rank << ": a " << to_string(wt.phase) << " wait of microbatch "
                           << wt.microbatch << " is not inside its segment";
    }
    // The segments are the per-phase seconds the record reports (one clock reading serves both), and no rank's step
    // phase exceeds the slowest rank's.
    std::array<double, kPhases> totals{};
    for (int step = 1; step <= 2; ++step) {
      const auto t = phase_totals(r.segments[size_t(rank)], step);
      for (int ph = 0; ph < kPhases; ++ph) {
        totals[size_t(ph)] += t[size_t(ph)];
        EXPECT_LE(t[size_t(ph)], r.step_phase_seconds[size_t(step - 1)][size_t(ph)]);
      }
    }
    for (int ph = 0; ph < kPhases; ++ph)
      EXPECT_NEAR(totals[size_t(ph)], r.ranks[size_t(rank)].phase_seconds[size_t(ph)],
                  1e-9 * (1 + totals[size_t(ph)]))
          << "rank " << rank << " phase " << to_string(Phase(ph));
  }
  // The record's pipeline wait: the least any rank waited, over the steps after the first (one: the median of one),
  // within the step; `lcplan validate` sets it beside the estimator's bubble.
  const Measurement rec = measurement_record(sc, o, r, "test host");
  double least = 1e300;
  for (const auto& segs : r.segments) least = std::min(least, pipeline_wait_seconds(segs, 2));
  ASSERT_EQ(r.step_pipeline_wait_seconds.size(), 2u);
  EXPECT_DOUBLE_EQ(r.step_pipeline_wait_seconds[1], least);
  ASSERT_TRUE(rec.executor.contains("pipeline_wait_seconds"));
  EXPECT_DOUBLE_EQ(rec.executor.at("pipeline_wait_seconds").get<double>(), least);
  EXPECT_GT(least, 0);  // every stage of a pipeline waits to fill and drain it
  EXPECT_LT(least, r.step_seconds[1]);
  // Time of every phase some rank ran, memory of the peak rank's phases only.
  for (int ph = 0; ph < kPhases; ++ph) {
    ASSERT_TRUE(rec.phases[ph].has_value()) << to_string(Phase(ph));
    EXPECT_TRUE(rec.phases[ph]->seconds.has_value()) << to_string(Phase(ph));
    EXPECT_EQ(rec.phases[ph]->peak_bytes.has_value(), r.ranks[size_t(*rec.peak_rank)].phases[ph].seen);
  }
  const Comparison c = compare(sc.model, sc.plan, h100(), exec_calibration(), rec);
  ASSERT_TRUE(c.estimate_bubble_seconds && c.measured_pipeline_wait_seconds);
  EXPECT_GT(*c.estimate_bubble_seconds, 0);
  EXPECT_EQ(*c.measured_pipeline_wait_seconds, least);
  EXPECT_NE(comparison_table(c).find("pp bubble"), std::string::npos);
  Measurement bad = rec;
  bad.executor["pipeline_wait_seconds"] = "long";
  EXPECT_THROW(compare(sc.model, sc.plan, h100(), exec_calibration(), bad), UserError);
  // Without gather_segments a run keeps no segments, only the per-step waits.
  ExecOptions plain;
  const ExecResult r1 = run_case(w.c, sc, plain);
  EXPECT_TRUE(r1.segments.empty());
  ASSERT_EQ(r1.step_pipeline_wait_seconds.size(), 1u);
  EXPECT_GT(r1.step_pipeline_wait_seconds[0], 0);
  // This rank's hook saw exactly its segments' boundaries.
  const std::vector<PhaseSegment> mine = pair_marks(seen);
  std::vector<PhaseSegment> got;
  for (const PhaseSegment& sg : r.segments[size_t(w.c.rank)])
    if (!sg.wait) got.push_back(sg);
  ASSERT_EQ(mine.size(), got.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].phase, got[i].phase);
    EXPECT_EQ(mine[i].start, got[i].start);
    EXPECT_EQ(mine[i].end, got[i].end);
  }
}

}  // namespace
}  // namespace lcplan::exec::tests
