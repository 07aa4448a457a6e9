// Case collectives: all-to-all, all-gather, reduce-scatter, all-reduce and send/recv (every rank sends to the next
// and receives from the previous) by message size (--min-bytes .. --max-bytes, x --step-factor; sizes as
// nccl-tests gives them: the whole buffer per rank), per group placement: all ranks of a node, one rank per node
// across nodes (when the launch spans nodes), and the plan's TP / CP / EP groups in Megatron's rank order. Every
// group of a placement runs at once; the time per call is the slowest rank's. Fitted to alpha-beta per link tier.
#include <algorithm>
#include <cmath>

#include "parallel/rank_layout.h"
#include "profiler/cases.h"

namespace lcplan::profiler {

namespace {

struct Placement {
  std::string name;
  std::vector<int> members;  // this rank's group (a partition of the world)
  int size = 1;              // the group's size (the same for every group of the placement)
};

std::vector<Placement> placements(const CaseContext& c) {
  std::vector<Placement> out;
  const int P = c.world.size;
  std::vector<int> node, cross;
  for (int r = 0; r < P; ++r) {
    if (c.node.node_of[size_t(r)] == c.node.node) node.push_back(r);
  }
  // Cross-node: the ranks holding this rank's local index on every node.
  {
    std::vector<int> local_index(size_t(P), 0), count(size_t(c.node.nodes), 0);
    for (int r = 0; r < P; ++r) local_index[size_t(r)] = count[size_t(c.node.node_of[size_t(r)])]++;
    for (int r = 0; r < P; ++r)
      if (local_index[size_t(r)] == local_index[size_t(c.world.rank)]) cross.push_back(r);
  }
  // Every rank must walk the same placements: node-shaped ones only when all nodes hold as many ranks.
  if (!c.node.uniform) c.note("collectives: nodes hold different rank counts; node and cross-node placements skipped");
  if (c.node.uniform && c.node.local_size > 1) out.push_back({"node", node, int(node.size())});
  if (c.node.uniform && c.node.nodes > 1) out.push_back({"cross-node", cross, int(cross.size())});
  if (c.t.has_plan_groups) {
    const PlanGroups& g = c.t.groups;
    try {
      const RankLayout l = make_rank_layout(P, std::min(g.tp, P), 1, std::min(g.cp, P), std::min(g.ep, P), std::min(g.etp, P));
      for (const auto& [name, kind] : {std::pair<const char*, Group>{"tp", Group::TP}, {"cp", Group::CP}, {"ep", Group::EP}}) {
        const std::vector<int> m = group_ranks(l, kind, c.world.rank);
        if (m.size() > 1) out.push_back({name, m, int(m.size())});
      }
    } catch (const std::invalid_argument& e) {
      c.note(std::string("collectives: the plan's groups do not tile the ") + std::to_string(P) + " launched ranks (" +
             e.what() + "); measured the node and cross-node placements only");
    }
  }
  // One placement per distinct member list (a plan group equal to the node is measured once, under its plan name).
  std::vector<Placement> unique;
  for (const Placement& p : out) {
    bool dup = false;
    for (Placement& u : unique)
      if (u.members == p.members) {
        dup = true;
        u.name += "/" + p.name;
      }
    if (!dup) unique.push_back(p);
  }
  return unique;
}

}  // namespace

void run_collectives(CaseContext& c) {
  if (c.world.size < 2) {
    c.note("collectives: one rank, nothing to measure (launch under mpirun -np N)");
    return;
  }
  const std::vector<int64_t> sizes = geometric(int64_t(c.t.min_bytes), int64_t(c.t.max_bytes), c.t.step_factor);
  for (const Placement& p : placements(c)) {
    // The groups of a placement must agree on the group's size for one row (nodes of equal size).
    int sizes_agree[2] = {p.size, -p.size};
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes_agree, 2, MPI_INT, MPI_MAX, c.world.mpi));
    if (sizes_agree[0] != -sizes_agree[1]) {
      c.note("collectives: placement " + p.name + " has groups of different sizes (nodes of unequal rank counts); skipped");
      continue;
    }
    int nodes = 0;
    {
      std::vector<int> ns;
      for (int r : p.members) ns.push_back(c.node.node_of[size_t(r)]);
      std::sort(ns.begin(), ns.end());
      nodes = int(std::unique(ns.begin(), ns.end()) - ns.begin());
    }
    int worst_nodes = nodes;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &worst_nodes, 1, MPI_INT, MPI_MAX, c.world.mpi));
    const LinkTier tier = worst_nodes > 1 ? LinkTier::Network : LinkTier::NVLink;
    comm::Comm g = c.dev.split(p.members);
    try {
      for (const Coll coll : {Coll::AllToAll, Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce, Coll::SendRecv}) {
        for (int64_t s : sizes) {
          // Whole elements for every rank's share.
          const size_t unit = size_t(4 * p.size);
          const size_t bytes = (size_t(s) + unit - 1) / unit * unit;
          const int inner = int(std::clamp<double>(std::ceil(double(1 << 20) / double(bytes)), 1, 50));
          const Timing tm = c.dev.collective(g, coll, bytes, inner);
          CollectiveRow row;
          row.group = p.name, row.ranks = p.size, row.nodes = worst_nodes, row.tier = tier, row.coll = coll;
          row.bytes = double(bytes), row.seconds = tm.seconds;
          c.data.collectives.push_back(row);
          c.log("collectives " + p.name + " (" + std::to_string(p.size) + " ranks) " + to_string(coll) + " " +
                std::to_string(bytes) + " B: " + std::to_string(tm.seconds * 1e6) + " us, bus " +
                std::to_string(row.bus_bandwidth() / 1e9) + " GB/s");
        }
      }
    } catch (...) {
      c.dev.free(g);
      throw;
    }
    c.dev.free(g);
  }
}

}  // namespace lcplan::profiler
