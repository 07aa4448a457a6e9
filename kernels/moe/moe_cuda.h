// GPU executor of the chunked expert-parallel MoE layer: runs the step lists of chunk_schedule.h on a
// communication stream (NCCL all-to-all-v, counts exchanged first over MPI) and a compute stream (cuBLAS
// GEMMs, moe_kernels_cuda.h kernels), one CUDA event per step; a step waits on the events of its dependencies that
// live on the other stream. Same layer, same weights and same results as the CPU layer (moe_cpu.h) up to
// the chosen precision. Forward and backward (dgrad per chunk, delayed wgrad overlapping the tail dispatch-bwd).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/comm/comm.h"
#include "parallel/chunk_schedule.h"
#include "kernels/moe/moe_layer.h"

namespace lcplan::moe::gpu {

struct GpuOptions {
  // true: tokens on the wire, expert/shared weights and GEMM inputs in bf16 (fp32 accumulation); false: all fp32.
  // The router, its GEMM (no TF32), h1, the layer's input/output and every gradient of a weight stay fp32.
  bool bf16 = true;
  // false: every step also waits for the previously issued step (the serial no-chunk baseline).
  bool overlap = true;
  // Record a timing event pair around every step (read with step_times after the pass).
  bool time_steps = false;
};

// What the last forward moved and computed on this rank (host-known once counts are exchanged).
struct GpuTraffic {
  int64_t rows_sent = 0, rows_sent_remote = 0;  // token copies dispatched (remote: to other ranks)
  int64_t rows_received = 0;                    // rows this rank's experts process
  int64_t a2a_bytes_remote = 0;  // bytes leaving this rank over dispatch + combine + combine-bwd + dispatch-bwd
  double expert_flops = 0;       // routed-expert GEMM FLOPs of forward + backward (dgrad + wgrad) on this rank
  double shared_flops = 0;       // shared-expert GEMM FLOPs of forward + backward
};

class MoeLayerGpu {
 public:
  // ep must be an NCCL communicator (comm::world_nccl / comm::split of one) over the devices already selected
  // with cudaSetDevice; w is this rank's shard (make_weights with ep.rank, ep.size). Copies the weights to the
  // device. Throws std::invalid_argument (collectively) on bad config.
  MoeLayerGpu(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const GpuOptions& o = {});
  ~MoeLayerGpu();
  MoeLayerGpu(const MoeLayerGpu&) = delete;
  MoeLayerGpu& operator=(const MoeLayerGpu&) = delete;

  // out[tokens x hidden] = MoE(x), device fp32 pointers. Collective over ep (check_moe_args first). Work is
  // enqueued on stream(); the host blocks only on the router (its counts size the all-to-alls). x must stay
  // valid and unchanged until backward has been enqueued.
  void forward(const ChunkSchedule& s, const float* x, int tokens, float* out);
  // dx[tokens x hidden] for dout[tokens x hidden] (device fp32) with the schedule of the forward; weight grads
  // stay on the device (grads()). Replicated router/shared grads are partial sums over this rank's tokens.
  void backward(const ChunkSchedule& s, const float* dout, float* dx);

  // The weight gradients of the last backward, copied to host (synchronizes).
  MoeWeights grads() const;
  // Step times of the last forward / backward (seconds from the start of the pass's first issued step, from
  // CUDA events recorded around each step on its stream), indexed like the schedule's steps; needs time_steps.
  std::vector<StepTime> step_times(bool backward) const;
  GpuTraffic traffic() const;
  cudaStream_t stream() const;       // compute stream: the pass ends joined on it
  cudaStream_t comm_stream() const;  // NCCL stream

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lcplan::moe::gpu
