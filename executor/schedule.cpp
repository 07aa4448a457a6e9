#include "executor/schedule.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace lcplan::exec {

std::vector<std::pair<int, int>> interleaved_table(int microbatches, int vpp, int group) {
  // Megatron-LM schedules.py get_schedule_table: each group of `group` microbatches runs chunk 0, then chunk 1, ...;
  // the last group takes every microbatch left.
  std::vector<std::pair<int, int>> t;
  for (int g0 = 0; g0 < microbatches; g0 += group) {
    const int g1 = g0 + group >= microbatches ? microbatches : g0 + group;
    for (int chunk = 0; chunk < vpp; ++chunk)
      for (int mb = g0; mb < g1; ++mb) t.push_back({mb, chunk});
  }
  return t;
}

std::vector<PipeAction> pipeline_schedule(int pp, int vpp, int stage, int microbatches, int group) {
  if (pp < 1 || vpp < 1 || stage < 0 || stage >= pp || microbatches < 1 || group < 0)
    throw std::invalid_argument("pipeline_schedule: pp " + std::to_string(pp) + ", vpp " + std::to_string(vpp) +
                                ", stage " + std::to_string(stage) + ", microbatches " + std::to_string(microbatches) +
                                ", group " + std::to_string(group) +
                                " (valid: pp, vpp, microbatches >= 1, 0 <= stage < pp, group >= 0)");
  std::vector<PipeAction> out;
  if (vpp == 1) {
    // forward_backward_pipelining_without_interleaving (pp = 1 is forward_backward_no_pipelining: F, B, F, B, ...).
    const int warmup = std::min(pp - stage - 1, microbatches), remaining = microbatches - warmup;
    for (int i = 0; i < warmup; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < remaining; ++i) {
      out.push_back({true, warmup + i, 0});
      out.push_back({false, i, 0});
    }
    for (int i = remaining; i < microbatches; ++i) out.push_back({false, i, 0});
    return out;
  }
  // forward_backward_pipelining_with_interleaving, microbatch_group_size_per_vp_stage = group (default pp).
  const int g = group > 0 ? group : pp;
  const std::vector<std::pair<int, int>> table = interleaved_table(microbatches, vpp, g);
  const int total = microbatches * vpp;
  long warmup = 2L * (pp - stage - 1) + long(vpp - 1) * g;  // get_pp_rank_microbatches
  if (warmup >= total) warmup = total;
  const int remaining = total - int(warmup);
  auto fwd = [&](int k) { return PipeAction{true, table[k].first, table[k].second}; };
  auto bwd = [&](int k) { return PipeAction{false, table[k].first, vpp - 1 - table[k].second}; };
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int k = 0; k < remaining; ++k) {
    out.push_back(fwd(warmup + k));
    out.push_back(bwd(k));
  }
  for (int k = remaining; k < total; ++k) out.push_back(bwd(k));
  return out;
}

std::string simulate_pipeline(int pp, int vpp, int microbatches, std::vector<HeldCounts>* held, int group) {
  const int V = pp * vpp;
  std::vector<std::vector<PipeAction>> lists(pp);
  for (int s = 0; s < pp; ++s) lists[s] = pipeline_schedule(pp, vpp, s, microbatches, group);
  std::vector<std::vector<char>> fdone(V, std::vector<char>(microbatches, 0)), bdone = fdone;
  std::vector<size_t> next(pp, 0);
  std::vector<std::vector<int>> count(pp, std::vector<int>(vpp, 0));
  if (held) held->assign(pp, HeldCounts{});
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < pp; ++s)
      while (next[s] < lists[s].size()) {
        const PipeAction& a = lists[s][next[s]];
        const int v = a.chunk * pp + s;
        const bool ready = a.forward ? (v == 0 || fdone[v - 1][a.microbatch])
                                     : (v == V - 1 ? fdone[v][a.microbatch] != 0 : bdone[v + 1][a.microbatch] != 0);
        if (!ready) break;
        if (held) (*held)[s].before_action.push_back(count[s]);
        (a.forward ? fdone : bdone)[v][a.microbatch] = 1;
        count[s][a.chunk] += a.forward ? 1 : -1;
        ++next[s];
        moved = true;
      }
  }
  for (int s = 0; s < pp; ++s)
    if (next[s] < lists[s].size())
      return "pipeline stage " + std::to_string(s) + " waits forever at action " + std::to_string(next[s]) + " (pp " +
             std::to_string(pp) + ", vpp " + std::to_string(vpp) + ", " + std::to_string(microbatches) +
             " microbatches)";
  return "";
}

std::vector<int> held_at_first_backward(int pp, int vpp, int stage, int microbatches, int group) {
  std::vector<int> n(vpp, 0);
  for (const PipeAction& a : pipeline_schedule(pp, vpp, stage, microbatches, group)) {
    if (!a.forward) break;
    ++n[a.chunk];
  }
  return n;
}

std::string pipeline_message_order_error(int pp, int vpp, int microbatches, bool per_direction) {
  struct Message {
    bool forward;
    int from, microbatch;
  };
  // Per channel (direction or -1, sender, receiver): the messages in the sender's order and in the receiver's.
  using Channel = std::tuple<int, int, int>;
  std::map<Channel, std::vector<Message>> sent, received;
  const int V = pp * vpp;
  for (int s = 0; s < pp; ++s)
    for (const PipeAction& a : pipeline_schedule(pp, vpp, s, microbatches)) {
      const int v = a.chunk * pp + s;
      const int dir = per_direction ? int(a.forward) : -1;
      // An action receives first (a forward from v - 1, a backward from v + 1), then sends (to v + 1, to v - 1).
      if (a.forward ? v > 0 : v < V - 1) {
        const int from = a.forward ? v - 1 : v + 1;
        received[{dir, from % pp, s}].push_back({a.forward, from, a.microbatch});
      }
      if (a.forward ? v < V - 1 : v > 0) {
        const int to = a.forward ? v + 1 : v - 1;
        sent[{dir, s, to % pp}].push_back({a.forward, v, a.microbatch});
      }
    }
  auto name = [](const Message& m) {
    return std::string(m.forward ? "activations" : "gradients") + " of virtual stage " + std::to_string(m.from) +
           ", microbatch " + std::to_string(m.microbatch);
  };
  const std::string where = " (pp " + std::to_string(pp) + ", vpp " + std::to_string(vpp) + ", " +
                            std::to_string(microbatches) + " microbatches)";
  for (const auto& [ch, s] : sent) {
    const std::vector<Message>& r = received[ch];
    const auto& [dir, from, to] = ch;
    if (s.size() != r.size())
      return "stage " + std::to_string(from) + " sends " + std::to_string(s.size()) + " messages to stage " +
             std::to_string(to) + ", which receives " + std::to_string(r.size()) + where;
    for (size_t i = 0; i < s.size(); ++i)
      if (std::tie(s[i].forward, s[i].from, s[i].microbatch) != std::tie(r[i].forward, r[i].from, r[i].microbatch))
        return "stage " + std::to_string(to) + " receives " + name(s[i]) + " where it expects " + name(r[i]) + where;
  }
  return "";
}

}  // namespace lcplan::exec
