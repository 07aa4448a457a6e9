// Exhaustive search over the plan space: cheap rules first, then memory, then time for plans that fit.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "estimator/estimate.h"
#include "estimator/plan_rules.h"
#include "search/plan_space.h"

namespace lcplan {

enum class Objective { Throughput, Memory };

struct SearchOptions {
  double headroom_bytes = 0;     // keep this much of HBM free (fragmentation spikes, NCCL growth)
  Objective objective = Objective::Throughput;
  double throughput_floor = 0;   // Memory objective: minimum tokens/s per GPU
  int top_k = 10;
};

struct Candidate {
  Plan plan;
  Estimate estimate;
};

// Rejection counters: one per plan rule, plus memory.
constexpr int kMemoryReject = static_cast<int>(Rule::Count);
using RejectCounts = std::array<size_t, kMemoryReject + 1>;

struct SearchResult {
  std::vector<Candidate> top;     // best first by the objective
  std::vector<Candidate> pareto;  // peak memory vs tokens/s front, ascending memory
  size_t candidates = 0;          // plans enumerated
  size_t evaluated = 0;           // plans whose memory was estimated (passed every rule)
  size_t feasible = 0;            // plans that fit
  RejectCounts rejects{};
  Candidate smallest_peak;        // the valid plan closest to fitting (when nothing fits)
  bool any_valid = false;
  double seconds = 0;
};

using Progress = std::function<void(size_t done, size_t total)>;

// `base` supplies the fixed fields (model, gpus, seq, hardware, global batch, implementation, ...).
SearchResult search_plans(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                          const Calibration& cal, const SearchOptions& opt, const Progress& progress = {});

// One sentence saying why nothing fits (the tightest constraint), for an empty result.
std::string explain_infeasible(const SearchResult& r, const Hardware& hw, const SearchOptions& opt);

}  // namespace lcplan
