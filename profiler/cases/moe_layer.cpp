// Case moe_layer: the chunked expert-parallel MoE layer forward + backward (kernels/moe) by local tokens and chunk
// count, over the EP group, recording each stream's intervals (CPU: each step's start and end on the two logical
// streams; GPU: CUPTI kernel records on the compute and NCCL streams), so the overlap of all-to-all with the expert
// GEMMs is measured: overlap = time both streams were busy / all-to-all (communication stream) busy time.
#include "parallel/rank_layout.h"
#include "profiler/cases.h"

namespace lcplan::profiler {

namespace {

// The EP group of this rank: the plan's (Megatron expert order etp-ep-edp) when it fits the launched ranks, else all.
std::vector<int> ep_group(const CaseContext& c, int& ep) {
  ep = c.world.size;
  if (c.t.has_plan_groups) {
    const PlanGroups& g = c.t.groups;
    const int want = std::min(g.ep, c.world.size);
    try {
      const RankLayout l = make_rank_layout(c.world.size, std::min(g.tp, c.world.size), 1, 1, want, std::min(g.etp, c.world.size));
      ep = want;
      return group_ranks(l, Group::EP, c.world.rank);
    } catch (const std::invalid_argument&) {
      if (c.world.size % want == 0) {
        ep = want;
        std::vector<int> r;
        for (int i = c.world.rank / want * want; i < (c.world.rank / want + 1) * want; ++i) r.push_back(i);
        return r;
      }
    }
  }
  std::vector<int> all(size_t(c.world.size));
  for (int i = 0; i < c.world.size; ++i) all[size_t(i)] = i;
  return all;
}

double layer_flops(const moe::MoeConfig& m, int64_t tokens) {
  const double h = m.hidden;
  return 3.0 * double(tokens) * (m.top_k * 6.0 * h * m.expert_ffn + 6.0 * h * m.shared_ffn + 2.0 * h * m.experts);
}

}  // namespace

void run_moe_layer(CaseContext& c) {
  if (c.t.moe_tokens.empty()) return;
  int ep = 1;
  const std::vector<int> members = ep_group(c, ep);
  comm::Comm g = c.dev.split(members);
  int max_chunks = 1;
  for (int k : c.t.moe_chunks) max_chunks = std::max(max_chunks, k);
  try {
    for (int64_t tokens0 : c.t.moe_tokens) {
      moe::MoeConfig m = c.t.moe;
      int64_t tokens = tokens0, hidden = m.hidden, ffn = m.expert_ffn, shared = m.shared_ffn,
              local = std::max(1, c.t.moe_local_experts);
      const int64_t min_local = std::max<int64_t>(1, (m.top_k + ep - 1) / ep);
      auto sync = [&] {
        m.hidden = int(hidden), m.expert_ffn = int(ffn), m.shared_ffn = int(shared), m.experts = int(local * ep);
      };
      const std::string shrunk = shrink_to_budget(
          {{"tokens", &tokens, std::max<int64_t>(256, 64 * max_chunks), 0}, {"hidden", &hidden, 256, 1}, {"ffn", &ffn, 64, 1},
           {"shared ffn", &shared, shared > 0 ? 64 : 0, 1}, {"experts per rank", &local, min_local, 2}},
          [&] { sync(); return layer_flops(m, tokens); }, c.budget());
      sync();
      // Group-limited routers need groups that divide the (possibly shrunk) expert count.
      if (m.router == moe::Router::SigmoidGroupLimited) {
        m.n_group = std::max(1, std::min(m.n_group, m.experts));
        while (m.experts % m.n_group) --m.n_group;
        m.topk_group = std::min(m.topk_group, m.n_group);
        while (m.topk_group * (m.experts / m.n_group) < m.top_k && m.topk_group < m.n_group) ++m.topk_group;
      }
      if (!shrunk.empty())
        c.note("moe_layer: " + shrunk + " to fit the CPU budget of " + gflop(c.budget()) + " per call (EP " +
               std::to_string(ep) + ", top_k " + std::to_string(m.top_k) + " kept)");
      if (ep == 1) c.note("moe_layer: EP group of one rank, no all-to-all: overlap not measured (launch more ranks)");
      std::vector<std::pair<int, bool>> runs;
      for (int k : c.t.moe_chunks) runs.push_back({k, true});
      if (ep > 1) runs.push_back({max_chunks, false});  // the serial baseline: every all-to-all waited on at once
      for (const auto& [chunks, overlap] : runs) {
        if (chunks > tokens) continue;
        const MoeTiming tm = c.dev.moe_layer(g, MoeShape{m, tokens, chunks, overlap});
        MoeRow row;
        row.ranks = ep, row.tokens = tokens, row.chunks = chunks, row.overlap = overlap;
        row.hidden = m.hidden, row.experts = m.experts, row.top_k = m.top_k, row.ffn = m.expert_ffn,
        row.shared_ffn = m.shared_ffn;
        row.forward = tm.forward, row.backward = tm.backward, row.fwd = tm.fwd, row.bwd = tm.bwd;
        c.data.moe.push_back(row);
        c.log("moe_layer ep=" + std::to_string(ep) + " tokens=" + std::to_string(tokens) + " chunks=" +
              std::to_string(chunks) + (overlap ? "" : " serial") + ": " + std::to_string((tm.forward + tm.backward) * 1e3) +
              " ms, measured overlap fwd " + std::to_string(tm.fwd.overlap()) + " bwd " + std::to_string(tm.bwd.overlap()));
      }
    }
  } catch (...) {
    c.dev.free(g);
    throw;
  }
  c.dev.free(g);
}

}  // namespace lcplan::profiler
