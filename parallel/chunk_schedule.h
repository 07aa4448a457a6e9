// The chunked expert-parallel schedule as data: a list of steps, each on the communication or the compute
// stream, with dependencies. Built by a pure function (no MPI, no CUDA) so it can be printed and tested.
//
// The list is the issue order: each stream runs its steps in list order, and a step depends only on earlier steps
// (validate_steps checks both), so the two in-order streams can never deadlock and one pass over the list times it.
// Three interpreters read a schedule, one per purpose:
//  - costing: cost_steps() below (the estimator's MoE layer time, estimator/time_model.cpp, and simulate());
//  - CPU execution: kernels/moe/moe_cpu.cpp (non-blocking MPI polled between GEMM row blocks);
//  - GPU execution: kernels/moe/moe_cuda.cpp (comm and compute streams, events for dependencies).
//
// Forward (article section 2.4, chunk2): comm runs c0 dispatch, c1 dispatch, c0 combine, c1 combine; compute
// runs c0 GEMM, c1 GEMM; c_i dispatch -> c_i GEMM -> c_i combine. Backward mirrors it: combine-bwd per chunk,
// dgrad per chunk, a delayed wgrad after the last chunk's dgrad (overlapping the tail dispatch-bwd), dispatch-bwd.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lcplan::moe {

enum class StreamKind : uint8_t { Comm, Compute };

enum class StepOp : uint8_t {
  // forward
  Route,        // compute, all tokens: router logits, top-k, per-chunk counts per expert
  Counts,       // comm, all chunks: exchange tokens-per-expert counts (one small all-to-all)
  Permute,      // compute, chunk: gather the chunk's token copies into expert-major rows
  Dispatch,     // comm, chunk: all-to-all-v of rows to the ranks owning their experts
  SharedFwd,    // compute, all tokens: shared expert (no communication, hides the first dispatch)
  ExpertFwd,    // compute, chunk: grouped SwiGLU expert GEMMs (fc1 -> act -> fc2)
  Combine,      // comm, chunk: all-to-all-v of expert outputs back to the tokens' ranks
  Unpermute,    // compute, chunk: weighted sum of each token's k expert outputs + shared expert
  // backward
  UnpermuteBwd, // compute, chunk: grads of expert outputs and routing weights
  CombineBwd,   // comm, chunk: send output grads to the expert ranks
  SharedBwd,    // compute, all tokens: shared expert backward (dgrad + wgrad)
  ExpertDgrad,  // compute, chunk: input grads of the expert GEMMs
  DispatchBwd,  // comm, chunk: send input grads back to the tokens' ranks
  ExpertWgrad,  // compute, all chunks: delayed weight grads of every local expert
  PermuteBwd,   // compute, chunk: sum each token's k input grads
  RouterBwd,    // compute, all tokens: router grads and the final input grad
};

struct Step {
  StreamKind stream = StreamKind::Compute;
  StepOp op = StepOp::Route;
  int chunk = -1;          // -1: the step covers every chunk
  std::vector<int> deps;   // indices of earlier-or-other-stream steps in the same list that must finish first
};

struct ChunkSchedule {
  int chunks = 1;
  std::vector<double> weights;  // relative token share of each chunk (sums to 1)
  bool shared_expert = true;
  std::vector<Step> forward;
  std::vector<Step> backward;
};

// Most chunks a MoE layer is split into: the executors keep per-chunk state in fixed arrays, and the plan rules,
// the search space and the estimator use the same limit.
constexpr int kMaxChunks = 4;

// The schedule for `chunks` (1..kMaxChunks) chunks with optional relative `weights` (one positive value per chunk;
// empty = equal). Throws std::invalid_argument naming the bad value.
ChunkSchedule make_chunk_schedule(int chunks, const std::vector<double>& weights = {}, bool shared_expert = true);

// Token boundaries of each chunk: chunks+1 ascending values from 0 to tokens, every chunk at least one token,
// shares as close to `weights` as rounding allows. Throws when chunks > tokens.
std::vector<int> chunk_bounds(int tokens, int chunks, const std::vector<double>& weights = {});

const char* op_name(StepOp op);
const char* stream_name(StreamKind s);
// "c0 dispatch" / "route" (chunk -1 has no prefix).
std::string step_label(const Step& s);
// One line per step: index, stream, label, dependencies; then the per-stream orders.
std::string format_steps(const std::vector<Step>& steps);
std::string format_schedule(const ChunkSchedule& s);

// Checks that dependencies name existing, earlier steps (the list is the issue order). Throws std::logic_error
// describing the first problem.
void validate_steps(const std::vector<Step>& steps);

// What one pass over a schedule costs.
struct PassCost {
  double makespan = 0;      // end of the last step
  double compute_busy = 0;  // time the compute stream runs (floors included)
  double comm_busy = 0;     // time the communication stream runs
  double floor_excess = 0;  // compute time added by holding steps to their floor (e.g. kernel launch rate)
};

// The costing interpreter. Two in-order streams: a step starts when its stream's previous step and all its deps
// have finished. `duration(step)` returns {seconds, floor}: the step takes max(seconds, floor). `end` is scratch of
// steps.size() entries that receives every step's end time. The schedule must be valid (validate_steps).
template <class Duration>
PassCost cost_steps(const std::vector<Step>& steps, Duration&& duration, double* end) {
  PassCost c;
  double free_at[2] = {0, 0};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    const int s = st.stream == StreamKind::Comm ? 0 : 1;
    double ready = free_at[s];
    for (int d : st.deps) ready = ready > end[d] ? ready : end[d];
    const auto [seconds, floor] = duration(st);
    const double took = seconds > floor ? seconds : floor;
    end[i] = free_at[s] = ready + took;
    if (s == 0) {
      c.comm_busy += took;
    } else {
      c.compute_busy += took;
      c.floor_excess += took - seconds;
    }
    c.makespan = c.makespan > end[i] ? c.makespan : end[i];
  }
  return c;
}

// cost_steps with step i taking `duration[i]` (any unit): every step's start and end and the makespan.
struct Timeline {
  std::vector<double> start, end;
  double makespan = 0;
};
Timeline simulate(const std::vector<Step>& steps, const std::vector<double>& duration);

}  // namespace lcplan::moe
