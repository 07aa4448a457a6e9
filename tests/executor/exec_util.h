// Helpers for the executor tests: plans on the test models, running a plan on a sub-group of the MPI job, and the
// estimate of exactly what ran.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "estimator/memory_model.h"
#include "executor/executor.h"
#include "executor/scale.h"
#include "kernels/comm/comm.h"
#include "kernels/comm/groups.h"
#include "models/zoo.h"

namespace lcplan::exec::tests {

inline ModelSpec zoo(const std::string& name) { return load_model(name, LCPLAN_SOURCE_DIR); }
// The default profile as lcplan-exec reads it: its implementation overrides (workspace reservation, CE tile, ...).
inline Calibration exec_calibration() {
  return calibration_for(load_calibration("default", LCPLAN_SOURCE_DIR), "h100-sxm-80gb", "lcplan-exec");
}
inline Hardware h100() { return load_hardware("h100-sxm-80gb", LCPLAN_SOURCE_DIR); }

struct PlanArgs {
  int gpus = 1, cp = 1, ep = 1, global_batch = 0, micro_batch = 1, ep_chunks = 1, recompute_layers = 0;
  int tp = 1, pp = 1, vpp = 1, etp = 1;
  PipelineLayout pipeline{};  // uneven first/last stage layers or explicit layers per virtual stage
  int64_t seq = 8192;
  OptimizerSharding sharding = OptimizerSharding::None;
  Recompute recompute = Recompute::None;
  bool linear_ce = true;
};

// One row of a table test: a zoo model, its plan and the executor's scaling (executor/scale.h).
struct ExecCase {
  const char* name;
  const char* model;
  PlanArgs args;
  int scale = 64;
  int layers = 1;
};

inline Plan make_plan(const std::string& model, const PlanArgs& a) {
  Plan p;
  p.model = model;
  p.gpus = a.gpus;
  p.seq_len = a.seq;
  p.micro_batch = a.micro_batch;
  p.global_batch = a.global_batch;
  p.parallel.cp = a.cp;
  p.parallel.ep = a.ep;
  p.parallel.tp = a.tp;
  p.parallel.pp = a.pp;
  p.parallel.vpp = a.vpp;
  p.parallel.etp = a.etp;
  p.pipeline = a.pipeline;
  p.sequence_parallel = true;
  p.optimizer_sharding = a.sharding;
  p.recompute = a.recompute;
  p.recompute_layers = a.recompute_layers;
  p.linear_ce = a.linear_ce;
  p.moe.ep_chunks = a.ep_chunks;
  p.implementation = "lcplan-exec";
  return p;
}

// Busiest rank's routed token copies over the mean among the ranks of one pipeline stage (each stage holds its own
// MoE layers, so loads are per stage): the routing_imbalance the estimate of what ran takes.
inline double stage_load(const ExecResult& r, int stage) {
  double sum = 0, mx = 0, n = 0;
  for (const RankReport& rr : r.ranks)
    if (rr.stage == stage) {
      sum += rr.moe_rows_received;
      mx = std::max(mx, rr.moe_rows_received);
      ++n;
    }
  return sum > 0 ? std::max(1.0, mx / (sum / n)) : 1.0;
}

// Runs the scaled case on groups of plan.gpus consecutive ranks of `world` (every group runs the same plan).
inline ExecResult run_case(const comm::Comm& world, const ScaledCase& sc, ExecOptions o = {}) {
  const int g = sc.plan.gpus;
  std::vector<int> mine;
  for (int r = world.rank / g * g; r < world.rank / g * g + g; ++r) mine.push_back(r);
  comm::Comm sub = comm::split(world, mine);
  if (o.workspace_reserve == 0) o.workspace_reserve = exec_calibration().workspace_bytes;
  o.ce_vocab_tile = int64_t(exec_calibration().linear_ce_vocab_tile / 2);
  ExecResult r;
  try {
    r = run_executor(sub, sc.model, sc.plan, o);
  } catch (...) {
    comm::free_comm(sub);
    throw;
  }
  comm::free_comm(sub);
  return r;
}

}  // namespace lcplan::exec::tests
