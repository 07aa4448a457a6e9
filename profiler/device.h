// The device a profile measures: one interface, a CPU implementation (steady clock, Eigen / the project's CPU
// kernels, MPI) and a CUDA one (CUPTI activity records, cuBLAS / the project's CUDA kernels, NCCL). The cases
// (profiler/cases/) choose shapes and call these; a call runs its kernel `warmup` times untimed, then `repeats`
// timed times, each repeat started after a barrier of every rank and counted as the slowest rank's time, and returns
// the median. Kernel cases run on every rank at once, as every GPU of a node runs its kernels in training.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/comm/comm.h"
#include "kernels/linear_attention/linear_attention.h"
#include "kernels/moe/moe_layer.h"
#include "profiler/activity.h"
#include "profiler/profile_data.h"

namespace lcplan::profiler {

struct RepeatOptions {
  int warmup = 1;
  int repeats = 5;
};

struct Timing {
  double seconds = 0;  // median over repeats of the slowest rank's time
  double min = 0, max = 0;
  int repeats = 0;
};

struct MoeShape {
  moe::MoeConfig config;
  int64_t tokens = 0;  // local tokens per rank
  int chunks = 1;
  bool overlap = true;
};

struct MoeTiming {
  double forward = 0, backward = 0;  // medians, slowest rank
  OverlapSummary fwd, bwd;           // the two streams of the median repeat on this rank
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string backend() const = 0;      // "cpu" or "cuda"
  virtual std::string description() const = 0;  // device model, driver and library versions
  virtual std::vector<std::string> gemm_types() const = 0;  // CPU {"fp32"}; GPU {"bf16", "fp8"?}
  // C[m x n] = A[m x k] B[k x n].
  virtual Timing gemm(int64_t m, int64_t n, int64_t k, const std::string& type) = 0;
  // The MoE layer's routed-expert forward GEMMs over `experts` local experts with `tokens` rows each.
  virtual Timing grouped_gemm(int experts, int64_t tokens, int64_t hidden, int64_t ffn) = 0;
  // Causal attention forward + backward.
  virtual Timing attention(const attention::Shape& s) = 0;
  // Gated DeltaNet forward + backward with its causal conv1d (kernel 4) over q, k, v.
  virtual Timing linear_attention(const linear_attention::Shape& s) = 0;
  // Loss forward + backward: streamed (linear CE) or materialized logits.
  virtual Timing linear_ce(int64_t tokens, int64_t hidden, int64_t vocab, int64_t vocab_tile, int64_t token_tile,
                           bool materialized) = 0;
  virtual std::string linear_ce_type() const = 0;
  // One MoE layer forward + backward over the EP group `ep` (collective over it).
  virtual MoeTiming moe_layer(const comm::Comm& ep, const MoeShape& s) = 0;
  // One collective of `bytes` (nccl-tests size) over `group`, `inner` back-to-back calls per repeat; the time is per
  // call, max over every rank of `world` (all groups of a kind run at once).
  virtual Timing collective(const comm::Comm& group, Coll c, size_t bytes, int inner) = 0;
  // A copy of `bytes` between two buffers in device memory.
  virtual Timing copy(size_t bytes) = 0;
  // Host seconds to issue one kernel.
  virtual Timing launch() = 0;
  virtual std::string launch_what() const = 0;
  // Split `world` the way this backend needs (NCCL sub-communicators on GPUs).
  virtual comm::Comm split(const std::vector<int>& ranks) = 0;
  virtual void free(comm::Comm& c) = 0;
};

// `world` must outlive the device.
std::unique_ptr<Device> make_cpu_device(const comm::Comm& world, const RepeatOptions& o);
// Throws UserError when this build has no CUDA or no device is usable.
std::unique_ptr<Device> make_cuda_device(const comm::Comm& world, const RepeatOptions& o);
bool cuda_compiled();
// Empty when a CUDA device is usable by this build, else one sentence why not.
std::string cuda_unavailable_reason();
// CUDA devices this process sees (0 without CUDA or a usable device).
int cuda_devices();

}  // namespace lcplan::profiler
