// The case table and what every case shares: where the ranks sit, number formatting.
#include <algorithm>
#include <cstdio>

#include "profiler/cases.h"

namespace lcplan::profiler {

const std::vector<CaseInfo>& case_table() {
  static const std::vector<CaseInfo> table = {
      {"gemm", run_gemm, "dense GEMM by tokens for each (n, k) class"},
      {"grouped_gemm", run_grouped_gemm, "routed-expert forward GEMMs by tokens per local expert"},
      {"attention", run_attention, "causal attention forward + backward by local sequence"},
      {"linear_attention", run_linear_attention, "gated DeltaNet + conv1d forward + backward by sequence"},
      {"linear_ce", run_linear_ce, "loss layer forward + backward: linear CE and materialized logits"},
      {"moe_layer", run_moe_layer, "chunked-EP MoE layer forward + backward, per-stream intervals"},
      {"collectives", run_collectives, "all-to-all, all-gather, reduce-scatter, all-reduce, send/recv by size"},
      {"copy", run_copy, "device-memory copy by size"},
      {"launch", run_launch, "host seconds per kernel launch"},
  };
  return table;
}

NodeInfo node_info(const comm::Comm& world) {
  NodeInfo n;
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &n.local_rank));
  MPI_CHECK(MPI_Comm_size(local, &n.local_size));
  // A node is named by the world rank of its first member.
  int leader = world.rank;
  MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, local));
  MPI_CHECK(MPI_Comm_free(&local));
  std::vector<int> leaders(size_t(world.size));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world.mpi));
  std::vector<int> unique = leaders;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  n.nodes = int(unique.size());
  n.node_of.resize(leaders.size());
  for (size_t r = 0; r < leaders.size(); ++r)
    n.node_of[r] = int(std::lower_bound(unique.begin(), unique.end(), leaders[r]) - unique.begin());
  n.node = n.node_of[size_t(world.rank)];
  int sizes[2] = {n.local_size, -n.local_size};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, world.mpi));
  n.uniform = sizes[0] == -sizes[1];
  return n;
}

std::string gflop(double flops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g GFLOP", flops / 1e9);
  return buf;
}

}  // namespace lcplan::profiler
