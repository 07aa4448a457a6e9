// The profile's cases, one file each (profiler/cases/*.cpp, nccl-tests style), behind one driver (driver.h). A case
// walks its sweep from the Targets, shrinks a shape over the CPU budget (shrink_to_budget, with a note), times each
// point on the Device and appends rows to ProfileData. Every rank runs every case with the same shapes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/comm/comm.h"
#include "profiler/device.h"
#include "profiler/profile_data.h"
#include "profiler/shapes.h"

namespace lcplan::profiler {

// Where the ranks sit: node of every world rank (MPI_COMM_TYPE_SHARED), so groups can be placed within a node or
// across nodes.
struct NodeInfo {
  int nodes = 1;
  int node = 0;             // this rank's node
  int local_rank = 0, local_size = 1;
  bool uniform = true;      // every node holds the same number of ranks (node and cross-node placements need it)
  std::vector<int> node_of; // world rank -> node
};
// Collective over `world`.
NodeInfo node_info(const comm::Comm& world);

struct CaseContext {
  Device& dev;
  const comm::Comm& world;
  const NodeInfo& node;
  const Targets& t;
  ProfileData& data;
  std::function<void(const std::string&)> log;  // progress (printed by rank 0)
  void note(const std::string& s) const { data.notes.push_back(s); }
  double budget() const { return t.max_call_flops; }
};

struct CaseInfo {
  const char* name;
  void (*run)(CaseContext&);
  const char* measures;  // one line: what the case times (profiler/README.md has the full definitions)
};
// Every case, in the order the driver runs them.
const std::vector<CaseInfo>& case_table();

void run_gemm(CaseContext& c);
void run_grouped_gemm(CaseContext& c);
void run_attention(CaseContext& c);
void run_linear_attention(CaseContext& c);
void run_linear_ce(CaseContext& c);
void run_moe_layer(CaseContext& c);
void run_collectives(CaseContext& c);
void run_copy(CaseContext& c);
void run_launch(CaseContext& c);

// "1.5 GFLOP" for notes.
std::string gflop(double flops);

}  // namespace lcplan::profiler
