// The memory categories of a per-GPU breakdown, named once: every record writer, parser, table and chart iterates
// kMemoryCategories instead of listing them (README "What each number means" explains each term at length).
#pragma once

#include <array>

namespace lcplan {

// Code names of the categories, in the table's order (the order records and charts use: static state first, then
// what grows with tokens, then the calibrated overheads).
enum class MemoryCategory : int {
  Params,
  Grads,
  Optimizer,
  FsdpBuffers,
  Activations,
  Logits,
  MoeBuffers,
  Workspace,
  CudaContext,
  Fragmentation,
  Count
};
constexpr int kMemoryCategoryCount = static_cast<int>(MemoryCategory::Count);

// Bytes per category on one GPU at one moment; each member's meaning is its kMemoryCategories row.
struct MemoryBreakdown {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double fsdp_buffers = 0;
  double activations = 0;
  double logits = 0;
  double moe_buffers = 0;
  double workspace = 0;
  double cuda_context = 0;
  double fragmentation = 0;

  double total() const;  // the sum over kMemoryCategories, in their order
};

struct MemoryCategoryInfo {
  MemoryCategory id;
  const char* name;                 // key in every record's breakdown (estimate, measurement, validation)
  const char* column;               // at most 7 characters: the header of `lcplan estimate`'s table
  double MemoryBreakdown::*member;  // where a MemoryBreakdown holds it
  const char* meaning;              // one line
};

inline constexpr std::array<MemoryCategoryInfo, kMemoryCategoryCount> kMemoryCategories = {{
    {MemoryCategory::Params, "params", "params", &MemoryBreakdown::params,
     "weights resident on this GPU (bf16, plus a low-precision recipe's copy; sharded under FSDP)"},
    {MemoryCategory::Grads, "grads", "grads", &MemoryBreakdown::grads, "main gradients (fp32 by default)"},
    {MemoryCategory::Optimizer, "optimizer", "optim", &MemoryBreakdown::optimizer,
     "fp32 master weights + Adam moments, after sharding (0 when offloaded)"},
    {MemoryCategory::FsdpBuffers, "fsdp_buffers", "fsdp", &MemoryBreakdown::fsdp_buffers,
     "all-gathered current + prefetched unit and the unsharded gradient of one unit"},
    {MemoryCategory::Activations, "activations", "activ", &MemoryBreakdown::activations,
     "saved activations of in-flight microbatches + the recomputed layer's working set"},
    {MemoryCategory::Logits, "logits", "logits", &MemoryBreakdown::logits,
     "materialized logits, or linear CE's tiles and per-token statistics"},
    {MemoryCategory::MoeBuffers, "moe_buffers", "moe", &MemoryBreakdown::moe_buffers,
     "transient dispatch/combine/permutation buffers of the MoE layer being run"},
    {MemoryCategory::Workspace, "workspace", "wkspc", &MemoryBreakdown::workspace,
     "cuBLAS/attention workspaces, NCCL buffers"},
    {MemoryCategory::CudaContext, "cuda_context", "ctx", &MemoryBreakdown::cuda_context,
     "CUDA context outside the caching allocator"},
    {MemoryCategory::Fragmentation, "fragmentation", "frag", &MemoryBreakdown::fragmentation,
     "allocator overhead on the dynamic terms"},
}};

// Row i describes category i, so code names index the table.
constexpr bool memory_categories_in_order() {
  for (int i = 0; i < kMemoryCategoryCount; ++i)
    if (static_cast<int>(kMemoryCategories[i].id) != i) return false;
  return true;
}
static_assert(memory_categories_in_order(), "kMemoryCategories rows must follow enum MemoryCategory");

constexpr const MemoryCategoryInfo& memory_category(MemoryCategory c) { return kMemoryCategories[static_cast<int>(c)]; }

inline double MemoryBreakdown::total() const {
  double t = 0;
  for (const MemoryCategoryInfo& c : kMemoryCategories) t += this->*c.member;
  return t;
}

}  // namespace lcplan
