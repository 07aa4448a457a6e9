// What `lcplan profile` measured (one row per timed shape, seconds are medians of repeats) and the pure derivation
// of calibration coefficients and of a CPU hardware profile from it. The cases (profiler/cases/) fill the rows; no
// function here runs a kernel, so the derivation is tested on synthetic rows (tests/profiler/derive_test.cpp).
//
// Every efficiency is the estimator's own inverse: model FLOPs of the shape counted as estimator/flops.h counts them,
// divided by the measured time and by the hardware profile's peak (and, for attention, FlashAttention-3's head-dim
// factor of estimator/time_model.cpp), so that the estimator, given the fitted coefficients, predicts the measured
// time back.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "parallel/rank_layout.h"
#include "profiler/activity.h"

namespace lcplan::profiler {

enum class Coll : uint8_t { AllToAll, AllGather, ReduceScatter, AllReduce, SendRecv };
const char* to_string(Coll c);
// nccl-tests bus-bandwidth factor (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): busbw =
// algbw x factor; the estimator's collective_seconds uses the same factors.
double bus_factor(Coll c, int ranks);

struct GemmRow {
  int64_t m = 0, n = 0, k = 0;  // C[m x n] = A[m x k] B[k x n]; m = tokens
  std::string type;             // "fp32" (CPU, Eigen), "bf16" or "fp8" (cuBLAS / cuBLASLt)
  std::string shape_class;      // which GEMM of the model / sweep it stands for ("qkv", "1024x1024")
  double seconds = 0;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// The MoE layer's routed-expert GEMMs, forward: per local expert fc1 [T x H] x [H x 2F], SwiGLU, fc2 [T x F] x [F x H].
struct GroupedRow {
  int experts = 0;                 // local experts
  int64_t tokens_per_expert = 0, hidden = 0, ffn = 0;
  double seconds = 0;
  double flops() const { return 6.0 * experts * double(tokens_per_expert) * double(hidden) * double(ffn); }
};

// Causal softmax attention forward + backward on one rank's local sequence.
struct AttentionRow {
  int64_t seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double forward_flops = 0;  // estimator/flops.h attn_core of this shape (4 x heads x head_dim x s x s/2)
  double seconds = 0;        // forward + backward
};

// Gated DeltaNet forward + backward (delta rule and its causal conv1d).
struct LinearAttentionRow {
  int64_t seq = 0, key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;
  double forward_flops = 0;  // estimator/flops.h linear_core of this shape
  double seconds = 0;        // forward + backward
};

// Loss layer forward + backward: linear CE (streamed tiles) and the materialized baseline at the same shape.
struct LinearCeRow {
  int64_t tokens = 0, hidden = 0, vocab = 0, vocab_tile = 0, token_tile = 0;
  std::string type;              // "fp32" or "bf16"
  double linear_seconds = 0;
  double materialized_seconds = 0;  // 0 when the baseline was not run (too large to materialize)
};

// One chunked-EP MoE layer forward + backward; per pass the two streams' measured intervals.
struct MoeRow {
  int ranks = 1;              // EP group
  int64_t tokens = 0;         // local tokens per rank
  int chunks = 1;
  bool overlap = true;        // false: every communication step waited on at once (serial baseline)
  int hidden = 0, experts = 0, top_k = 0, ffn = 0, shared_ffn = 0;
  double forward = 0, backward = 0;   // seconds, slowest rank
  OverlapSummary fwd, bwd;            // per-stream busy time of the median repeat, rank 0
};

struct CollectiveRow {
  std::string group;          // "node", "cross-node", or the plan's group ("ep", "cp", ...)
  int ranks = 0, nodes = 1;
  LinkTier tier = LinkTier::NVLink;
  Coll coll = Coll::AllReduce;
  double bytes = 0;           // nccl-tests size: the whole buffer per rank (all-gather: the gathered output)
  double seconds = 0;         // per call, slowest rank
  double bus_bandwidth() const { return seconds > 0 ? bytes * bus_factor(coll, ranks) / seconds : 0; }
};

struct CopyRow {
  double bytes = 0;    // buffer size; a copy reads and writes it (2 x bytes moved)
  double seconds = 0;
  double bandwidth() const { return seconds > 0 ? 2 * bytes / seconds : 0; }
};

struct LaunchRow {
  std::string what;         // what was launched ("empty kernel", "1x8x8 GEMM call")
  double seconds = 0;       // host seconds per launch
};

struct ProfileData {
  std::string backend;  // "cpu" or "cuda"
  std::vector<GemmRow> gemm;
  std::vector<GroupedRow> grouped;
  std::vector<AttentionRow> attention;
  std::vector<LinearAttentionRow> linear_attention;
  std::vector<LinearCeRow> linear_ce;
  std::vector<MoeRow> moe;
  std::vector<CollectiveRow> collectives;
  std::vector<CopyRow> copy;
  std::vector<LaunchRow> launch;
  std::vector<std::string> notes;  // shrunk shapes, skipped points and cases
};

nlohmann::json to_json(const ProfileData& d);

// A coefficient the profile measured: its value and how it was obtained (points, fit, residual).
struct Measured {
  double value = 0;
  std::string how;
  // Timed on lcplan's own kernel (attention, gated DeltaNet, linear CE), not a vendor library: on a GPU it describes
  // lcplan-exec, not what Megatron's cuDNN or fused kernels reach on that hardware.
  bool own_kernel = false;
};

// Calibration keys (estimator/calibration.cpp coefficient_table) -> measured values, plus the fits in JSON.
struct Derived {
  std::map<std::string, Measured> coefficients;
  nlohmann::json fits = nlohmann::json::object();
  std::vector<std::string> notes;  // coefficients that could not be derived and why
};

// Efficiencies relative to `hw`'s peaks and bandwidths, read the way the estimator applies them with `start` (the
// profile they join): its memory.linear_ce_vocab_tile picks the linear-CE rows the slowdown is taken from (every row
// when 0), its attention backward rate above head dim 128 splits a measured forward + backward.
Derived derive_coefficients(const ProfileData& d, const Hardware& hw, const Calibration& start);

// The CPU machine as a hardware profile: peaks = best measured fp32 GEMM rate / 0.95 (bf16 = fp8: a CPU has no
// low-precision tensor cores), HBM = best STREAM-like copy / 0.95, NVLink = best intra-node bus bandwidth / 0.95,
// network = best cross-node bus bandwidth / 0.95 (intra-node when the launch spans one node), host = best intra-node
// send/recv bandwidth / 0.95 (the copy bandwidth with one rank), gpus_per_node = ranks per node, memory = the node's
// memory / ranks per node. Throws std::invalid_argument when no GEMM or copy row exists.
struct CpuFacts {
  std::string name, cpu_model, date, command;
  double memory_bytes = 0;
  int ranks_per_node = 1;
};
nlohmann::json cpu_hardware_json(const ProfileData& d, const CpuFacts& f);

}  // namespace lcplan::profiler
