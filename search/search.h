// Exhaustive search over the plan space: cheap rules first, then memory, then time for plans that fit.
#pragma once

#include <array>
#include <concepts>
#include <functional>
#include <string>
#include <type_traits>
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
  // Plans the caller can use (lcplan tune: what its launcher runs, less the runs that did not fit); empty = all.
  // Asked after the plan rules, before memory; a plan it refuses is counted in SearchResult::refused.
  std::function<bool(const Plan&)> admit;
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
  size_t refused = 0;             // valid plans SearchOptions::admit left out
  RejectCounts rejects{};
  Candidate smallest_peak;        // the valid plan closest to fitting (when nothing fits)
  bool any_valid = false;
  double seconds = 0;
};

// What a progress callback sees: plans enumerated so far, the total, and the best plan that fits so far (by the
// objective), so that a caller can show how good the search already is.
struct SearchProgress {
  size_t done = 0, total = 0;
  size_t feasible = 0;
  bool has_best = false;
  double best_tokens_per_second_per_gpu = 0, best_tflops_per_gpu = 0;
};

// A progress callback taking either the whole SearchProgress or, as before, (done, total): existing callers keep
// compiling. Called every 1,024 plans and after each layout, and once at the end with done == total.
class Progress {
 public:
  Progress() = default;
  template <typename F>
    requires std::invocable<F&, const SearchProgress&>
  Progress(F f) {
    if (!empty(f)) f_ = std::move(f);
  }
  template <typename F>
    requires(std::invocable<F&, size_t, size_t> && !std::invocable<F&, const SearchProgress&>)
  Progress(F f) {
    if (!empty(f)) f_ = [g = std::move(f)](const SearchProgress& s) mutable { g(s.done, s.total); };
  }
  explicit operator bool() const { return bool(f_); }
  void operator()(const SearchProgress& s) const { f_(s); }

 private:
  // An empty std::function or a null function pointer stays "no callback" rather than one that throws when called.
  template <typename F>
  static bool empty(const F& f) {
    if constexpr (std::is_constructible_v<bool, const F&>) return !static_cast<bool>(f);
    else return false;
  }
  std::function<void(const SearchProgress&)> f_;
};

// `base` supplies the fixed fields (model, gpus, seq, hardware, global batch, implementation, ...).
SearchResult search_plans(const ModelSpec& m, const Plan& base, const PlanSpace& space, const Hardware& hw,
                          const Calibration& cal, const SearchOptions& opt, const Progress& progress = {});

// One sentence saying why nothing fits (the tightest constraint), for an empty result.
std::string explain_infeasible(const SearchResult& r, const Hardware& hw, const SearchOptions& opt);

}  // namespace lcplan
