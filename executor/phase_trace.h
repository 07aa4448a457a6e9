// The step loop's phase segments on each rank's host clock: what lcplan-exec times per phase (ExecResult), what a
// hook sees at each phase boundary (ExecOptions::on_phase: lcplan-exec's failure test hook, and where the GPU
// backend's CUPTI tags go), and a per-rank timeline of the pipeline schedule in the Chrome trace event format
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), which chrome://tracing and
// https://ui.perfetto.dev open: `lcplan-exec --phase-trace FILE`.
#pragma once

#include <array>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/memory_model.h"
#include "executor/tracking_allocator.h"

namespace lcplan::exec {

// One boundary of a phase segment. A segment is the forward or backward of one (microbatch, virtual stage), the loss
// of one microbatch, or the optimizer once per step.
struct PhaseMark {
  Phase phase = Phase::Forward;
  bool begin = true;
  int step = 1;         // 1-based
  int microbatch = -1;  // -1: the optimizer
  int vstage = -1;      // virtual pipeline stage (chunk x pp + stage) of a forward or backward; -1: loss, optimizer
  // Host seconds since the run's origin: each rank's clock right after one barrier before the first step, so ranks
  // line up to within that barrier's exit skew (on a GPU these are launch times, not device times).
  double seconds = 0;
};

struct PhaseSegment {
  Phase phase = Phase::Forward;
  int step = 1, microbatch = -1, vstage = -1;
  double start = 0, end = 0;  // seconds since the origin
  // A wait inside the phase segment of the same (phase, step, microbatch, vstage): the stage-to-stage receive of
  // that virtual stage's input activations (forward) or output gradient (backward), or (optimizer) the step's
  // all-rank reduction of loss and gradient norm, where a stage that drained early waits for the rest. Its time is
  // part of the phase's.
  bool wait = false;
};

// Seconds per phase (lcplan::Phase order) of one step, summed over its phase segments (waits are inside them, not
// added): the record's per-phase times.
std::array<double, kPhases> phase_totals(const std::vector<PhaseSegment>& segments, int step);

// Seconds of the wait segments of one step: the rank's time blocked on other ranks (the pipeline's fill and drain it
// sat through, plus the transfers and any imbalance between stages).
double pipeline_wait_seconds(const std::vector<PhaseSegment>& segments, int step);

// A segment as 7 doubles and back (the executor all-gathers every rank's segments).
constexpr int kSegmentDoubles = 7;
void pack_segment(const PhaseSegment& s, double* out);
PhaseSegment unpack_segment(const double* v);

// The Chrome trace of every rank's segments (index = world rank; stage_of_rank gives its pipeline stage): one
// process per rank named "rank R (stage S)", one complete ("X") event per segment named by phase, microbatch and
// virtual stage (a wait: "wait" and what it receives, drawn inside its phase's event), times in microseconds. Throws std::invalid_argument when the two lists differ in length.
nlohmann::json phase_trace_json(const std::vector<std::vector<PhaseSegment>>& per_rank,
                                const std::vector<int>& stage_of_rank);

}  // namespace lcplan::exec
