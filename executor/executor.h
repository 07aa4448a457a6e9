// lcplan-exec's training step on CPUs: the plan's model built layer by layer from kernels/, pipeline parallel (1F1B
// and the interleaved schedule, executor/schedule.h) over the stages and virtual stages the plan's split gives,
// tensor parallel with sequence parallelism, data parallel with dist_opt / FSDP sharding, context parallelism,
// expert (and expert tensor) parallelism through the chunked MoE layer, recompute as the estimator defines it, Adam;
// every tensor charged to the estimator's memory categories (executor/tracking_allocator.h). See executor/README.md.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "estimator/plan.h"
#include "executor/param_store.h"
#include "executor/phase_trace.h"
#include "executor/tracking_allocator.h"
#include "kernels/comm/comm.h"
#include "models/model_spec.h"

namespace lcplan::exec {

struct ExecOptions {
  int steps = 1;
  uint64_t seed = 1;
  double workspace_reserve = 0;  // bytes reserved for temporaries: the executor profile's memory.workspace_bytes
  AdamOptions adam;
  int64_t ce_vocab_tile = 512;   // linear-CE vocabulary columns per fp32 tile (data/calibration/default.json, per_implementation lcplan-exec)
  float rope_theta = 10000.0f;   // ModelSpec carries no RoPE base; any base gives the same memory and work
  // Called on this rank at each phase segment's start and end (executor/phase_trace.h). lcplan-exec hangs its phase
  // trace and its failure test hook here; the GPU backend's CUPTI tags go here too. An exception it throws fails the
  // rank as one thrown by the step would.
  std::function<void(const PhaseMark&)> on_phase;
  // Gather every rank's phase segments into ExecResult::segments (lcplan-exec --phase-trace): they grow with steps x
  // microbatches on every rank, so a plain run keeps only their per-step sums.
  bool gather_segments = false;
};

// One rank's measurements.
struct RankReport {
  int rank = 0;
  int stage = 0;                            // pipeline stage (Megatron's rank order: group_ranks(.., PP, ..))
  std::array<PhasePeak, kPhases> phases{};  // each phase's peak total and its breakdown
  double workspace_high_water = 0;          // most workspace bytes live at once (the reservation is reported apart)
  std::array<double, kPhases> phase_seconds{};  // wall seconds in each phase, summed over all steps
  double moe_rows_received = 0, moe_rows_sent = 0;  // routed token copies this rank's experts got / it sent
  double attention_pairs = 0;               // causal query-key pairs its attention kernels covered, all steps
  double tracker_ops = 0;                   // tracker add/sub calls (overhead benchmark)
  double cpu_seconds = 0;                   // this process's CPU time over all steps (wall time inflates on a
                                            // shared or oversubscribed machine; CPU time does not)
};

struct ExecResult {
  std::vector<double> loss, grad_norm, step_seconds;  // per step, identical on every rank
  // Per step, each phase's wall seconds on the slowest rank in that phase (identical on every rank).
  std::vector<std::array<double, kPhases>> step_phase_seconds;
  // Per step, each phase's seconds on the device's own clock (the GPU backend's CUDA events around each phase on the
  // compute stream, exec/phase_timer_cuda.h) on the slowest rank in that phase; zeros on CPUs.
  std::vector<std::array<double, kPhases>> step_device_phase_seconds;
  // Per step, the least CPU time any rank's main thread got (waits poll, so a rank that had its core all step gets
  // about its wall time; less means it shared the core with other processes and the wall times are disturbed).
  std::vector<double> step_cpu_seconds;
  std::vector<RankReport> ranks;                      // every rank's report, on every rank
  // Per step, the least time any rank waited on others (phase_trace.h pipeline_wait_seconds; identical on every rank).
  std::vector<double> step_pipeline_wait_seconds;
  // With ExecOptions::gather_segments: every rank's phase segments in its order, on every rank; else empty.
  std::vector<std::vector<PhaseSegment>> segments;
  double setup_seconds = 0;                           // process groups, parameter initialisation
  std::vector<std::string> notes;  // this rank's backend's remarks for the record (the GPU backend: the device's
                                   // used memory against the tracker's, when they disagree)
  int microbatches = 1;
  std::string backend = "cpu", device = "cpu";  // what ran the step (the record's backend and device)
};

// `m` and `p` are what runs (already scaled: executor_case()). Collective over `world`; every rank returns the same
// result. Throws UserError (same sentence on every rank) for a plan the executor refuses or a world-size mismatch;
// any other failure on a rank surfaces on its peers as comm::PeerFailure when `world` has a watchdog.
ExecResult run_executor(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o);

// The rank of the job's peak (largest peak total over ranks and phases) and that phase.
std::pair<int, Phase> job_peak(const ExecResult& r);

}  // namespace lcplan::exec
