#include "executor/phase_trace.h"

#include <stdexcept>
#include <string>

namespace lcplan::exec {

std::array<double, kPhases> phase_totals(const std::vector<PhaseSegment>& segments, int step) {
  std::array<double, kPhases> t{};
  for (const PhaseSegment& s : segments)
    if (!s.wait && s.step == step) t[size_t(s.phase)] += s.end - s.start;
  return t;
}

double pipeline_wait_seconds(const std::vector<PhaseSegment>& segments, int step) {
  double t = 0;
  for (const PhaseSegment& s : segments)
    if (s.wait && s.step == step) t += s.end - s.start;
  return t;
}

void pack_segment(const PhaseSegment& s, double* out) {
  out[0] = double(int(s.phase));
  out[1] = s.step;
  out[2] = s.microbatch;
  out[3] = s.vstage;
  out[4] = s.start;
  out[5] = s.end;
  out[6] = s.wait ? 1 : 0;
}

PhaseSegment unpack_segment(const double* v) {
  return PhaseSegment{Phase(int(v[0])), int(v[1]), int(v[2]), int(v[3]), v[4], v[5], v[6] != 0};
}

nlohmann::json phase_trace_json(const std::vector<std::vector<PhaseSegment>>& per_rank,
                                const std::vector<int>& stage_of_rank) {
  if (per_rank.size() != stage_of_rank.size())
    throw std::invalid_argument("phase trace: " + std::to_string(per_rank.size()) + " ranks of segments but " +
                                std::to_string(stage_of_rank.size()) + " stages");
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r) + " (stage " +
                                             std::to_string(stage_of_rank[r]) + ")"}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    for (const PhaseSegment& s : per_rank[r]) {
      std::string name = !s.wait                      ? to_string(s.phase)
                         : s.phase == Phase::Forward  ? "wait for activations"
                         : s.phase == Phase::Backward ? "wait for gradients"
                                                      : "wait for all ranks";
      if (s.microbatch >= 0) name += " mb " + std::to_string(s.microbatch);
      if (s.vstage >= 0) name += " v" + std::to_string(s.vstage);
      events.push_back({{"name", name}, {"cat", to_string(s.phase)}, {"ph", "X"}, {"pid", r}, {"tid", 0},
                        {"ts", s.start * 1e6}, {"dur", (s.end - s.start) * 1e6},
                        {"args", {{"step", s.step}, {"microbatch", s.microbatch}, {"vstage", s.vstage},
                                  {"wait", s.wait}}}});
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace lcplan::exec
