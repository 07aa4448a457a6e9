#include "parallel/chunk_schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace lcplan::moe {

namespace {

std::vector<double> normalized_weights(int chunks, const std::vector<double>& weights) {
  if (weights.empty()) return std::vector<double>(chunks, 1.0 / chunks);
  if (static_cast<int>(weights.size()) != chunks)
    throw std::invalid_argument("chunk weights have " + std::to_string(weights.size()) + " values but ep_chunks = " +
                                std::to_string(chunks) + "; give one weight per chunk");
  double sum = 0;
  for (double w : weights) {
    if (!(w > 0) || !std::isfinite(w))
      throw std::invalid_argument("chunk weight " + std::to_string(w) + " is not a positive number");
    sum += w;
  }
  std::vector<double> out(weights);
  for (double& w : out) w /= sum;
  return out;
}

struct Builder {
  std::vector<Step>& steps;
  int add(StreamKind s, StepOp op, int chunk, std::vector<int> deps) {
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    steps.push_back(Step{s, op, chunk, std::move(deps)});
    return static_cast<int>(steps.size()) - 1;
  }
};

}  // namespace

ChunkSchedule make_chunk_schedule(int chunks, const std::vector<double>& weights, bool shared_expert) {
  if (chunks < 1 || chunks > kMaxChunks)
    throw std::invalid_argument("ep_chunks = " + std::to_string(chunks) + " is outside the supported range 1.." +
                                std::to_string(kMaxChunks));
  ChunkSchedule s;
  s.chunks = chunks;
  s.weights = normalized_weights(chunks, weights);
  s.shared_expert = shared_expert;
  const auto C = StreamKind::Compute, M = StreamKind::Comm;
  std::vector<int> P(chunks), D(chunks), E(chunks), X(chunks), U(chunks);

  // Forward: list order is each stream's issue order (comm: counts, all dispatches, then all combines).
  Builder f{s.forward};
  const int route = f.add(C, StepOp::Route, -1, {});
  const int counts = f.add(M, StepOp::Counts, -1, {route});
  for (int c = 0; c < chunks; ++c) P[c] = f.add(C, StepOp::Permute, c, {route});
  for (int c = 0; c < chunks; ++c) D[c] = f.add(M, StepOp::Dispatch, c, {P[c], counts});
  const int shared = shared_expert ? f.add(C, StepOp::SharedFwd, -1, {route}) : -1;
  for (int c = 0; c < chunks; ++c) E[c] = f.add(C, StepOp::ExpertFwd, c, {D[c]});
  for (int c = 0; c < chunks; ++c) X[c] = f.add(M, StepOp::Combine, c, {E[c]});
  for (int c = 0; c < chunks; ++c) U[c] = f.add(C, StepOp::Unpermute, c, {X[c], shared});

  // Backward mirrors it; the wgrad of every chunk is delayed until after the last dgrad so it overlaps the
  // tail dispatch-bwd instead of holding back the next chunk's dgrad.
  Builder b{s.backward};
  std::vector<int> UB(chunks), CB(chunks), DG(chunks), DB(chunks), PB(chunks);
  for (int c = 0; c < chunks; ++c) UB[c] = b.add(C, StepOp::UnpermuteBwd, c, {});
  for (int c = 0; c < chunks; ++c) CB[c] = b.add(M, StepOp::CombineBwd, c, {UB[c]});
  const int shared_bwd = shared_expert ? b.add(C, StepOp::SharedBwd, -1, {}) : -1;
  for (int c = 0; c < chunks; ++c) DG[c] = b.add(C, StepOp::ExpertDgrad, c, {CB[c]});
  for (int c = 0; c < chunks; ++c) DB[c] = b.add(M, StepOp::DispatchBwd, c, {DG[c]});
  b.add(C, StepOp::ExpertWgrad, -1, DG);
  for (int c = 0; c < chunks; ++c) PB[c] = b.add(C, StepOp::PermuteBwd, c, {DB[c]});
  std::vector<int> router_deps = PB;
  router_deps.insert(router_deps.end(), UB.begin(), UB.end());
  router_deps.push_back(shared_bwd);
  b.add(C, StepOp::RouterBwd, -1, router_deps);

  validate_steps(s.forward);
  validate_steps(s.backward);
  return s;
}

std::vector<int> chunk_bounds(int tokens, int chunks, const std::vector<double>& weights) {
  if (chunks < 1) throw std::invalid_argument("ep_chunks = " + std::to_string(chunks) + " must be at least 1");
  if (chunks > tokens)
    throw std::invalid_argument("ep_chunks = " + std::to_string(chunks) + " is more than the " +
                                std::to_string(tokens) + " local tokens; use at most " +
                                std::to_string(std::max(1, tokens)) + " chunks");
  const std::vector<double> w = normalized_weights(chunks, weights);
  std::vector<int> b(chunks + 1, 0);
  double cum = 0;
  for (int c = 1; c < chunks; ++c) {
    cum += w[c - 1];
    const int ideal = static_cast<int>(std::lround(cum * tokens));
    b[c] = std::clamp(ideal, b[c - 1] + 1, tokens - (chunks - c));  // every chunk keeps at least one token
  }
  b[chunks] = tokens;
  return b;
}

const char* op_name(StepOp op) {
  switch (op) {
    case StepOp::Route: return "route";
    case StepOp::Counts: return "counts";
    case StepOp::Permute: return "permute";
    case StepOp::Dispatch: return "dispatch";
    case StepOp::SharedFwd: return "shared-expert";
    case StepOp::ExpertFwd: return "expert GEMM";
    case StepOp::Combine: return "combine";
    case StepOp::Unpermute: return "unpermute";
    case StepOp::UnpermuteBwd: return "unpermute-bwd";
    case StepOp::CombineBwd: return "combine-bwd";
    case StepOp::SharedBwd: return "shared-expert-bwd";
    case StepOp::ExpertDgrad: return "expert dgrad";
    case StepOp::DispatchBwd: return "dispatch-bwd";
    case StepOp::ExpertWgrad: return "expert wgrad (delayed)";
    case StepOp::PermuteBwd: return "permute-bwd";
    case StepOp::RouterBwd: return "router-bwd";
  }
  return "?";
}

const char* stream_name(StreamKind s) { return s == StreamKind::Comm ? "comm" : "compute"; }

std::string step_label(const Step& s) {
  std::string label;  // built by appends: GCC 12 warns falsely (-Wrestrict) on "c" + std::string
  if (s.chunk >= 0) label.append("c").append(std::to_string(s.chunk)).append(" ");
  return label.append(op_name(s.op));
}

std::string format_steps(const std::vector<Step>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    std::string line("  ");
    line.append(std::to_string(i)).append(i < 10 ? "  " : " ").append(stream_name(s.stream));
    line.append(s.stream == StreamKind::Comm ? "     " : "  ").append(step_label(s));
    if (!s.deps.empty()) {
      line.resize(std::max<size_t>(line.size(), 44), ' ');
      line += " after";
      for (int d : s.deps) line.append(" ").append(std::to_string(d));
    }
    out += line + "\n";
  }
  for (StreamKind k : {StreamKind::Comm, StreamKind::Compute}) {
    out += std::string("  ") + stream_name(k) + " order:";
    bool first = true;
    for (const Step& s : steps)
      if (s.stream == k) {
        out.append(first ? " " : ", ").append(step_label(s));
        first = false;
      }
    out += "\n";
  }
  return out;
}

std::string format_schedule(const ChunkSchedule& s) {
  std::string w;
  for (size_t i = 0; i < s.weights.size(); ++i) w.append(i ? "/" : "").append(std::to_string(s.weights[i]).substr(0, 5));
  std::string out("chunked EP schedule: ");
  out.append(std::to_string(s.chunks)).append(" chunk(s), token shares ").append(w);
  return out.append("\nforward:\n").append(format_steps(s.forward)).append("backward:\n").append(format_steps(s.backward));
}

void validate_steps(const std::vector<Step>& steps) {
  const int n = static_cast<int>(steps.size());
  for (int i = 0; i < n; ++i)
    for (int d : steps[i].deps) {
      if (d < 0 || d >= n || d == i)
        throw std::logic_error("step " + std::to_string(i) + " (" + step_label(steps[i]) + ") depends on step " +
                               std::to_string(d) + " which does not exist");
      if (d > i)
        throw std::logic_error("step " + std::to_string(i) + " (" + step_label(steps[i]) + ") depends on step " +
                               std::to_string(d) + " queued after it (the list is the issue order; the streams could deadlock)");
    }
}

Timeline simulate(const std::vector<Step>& steps, const std::vector<double>& duration) {
  const size_t n = steps.size();
  if (duration.size() != n)
    throw std::invalid_argument("simulate: " + std::to_string(duration.size()) + " durations for " +
                                std::to_string(n) + " steps");
  validate_steps(steps);
  Timeline t;
  t.end.assign(n, 0);
  size_t i = 0;
  const PassCost c = cost_steps(steps, [&](const Step&) { return std::pair<double, double>(duration[i++], 0.0); }, t.end.data());
  t.start.resize(n);
  for (size_t k = 0; k < n; ++k) t.start[k] = t.end[k] - duration[k];
  t.makespan = c.makespan;
  return t;
}

}  // namespace lcplan::moe
