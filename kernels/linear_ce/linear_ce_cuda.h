// CUDA linear cross-entropy: cuBLAS GEMMs for the logits tiles and both gradients, small fused kernels for the
// online log-sum-exp, the loss and the logits gradient (the same LCPLAN_HD math the CPU path runs).
//
// Launchers follow DeepEP's shape: device pointers, explicit sizes, caller-owned workspace and cuBLAS handle,
// stream last. All pointers are device pointers; inputs are fp32 or bf16 (CUDA_R_16BF), accumulation is fp32.
//
// Expected HBM traffic (N tokens, H hidden, V vocab, tiles Nt x Vt; T = 2 bytes for bf16, 4 for fp32), what a GPU run
// is judged against:
//   forward : 2NHV FLOPs; hidden read once per vocab tile (ceil(V/Vt) * N*H*T), the weight once per token tile
//             (ceil(N/Nt) * V*H*T), the fp32 logits tile written and re-read (2 * N*V*4; stays in L2 only while
//             Nt*Vt*4 fits), plus O(N) state.
//   backward: 6NHV FLOPs (recompute 2NHV, d_hidden 2NHV, d_weight 2NHV); hidden read twice per vocab tile
//             (2 * ceil(V/Vt) * N*H*T), the weight twice per token tile (2 * ceil(N/Nt) * V*H*T), fp32 logits written +
//             read (2 * N*V*4), the dlogits tile written + read twice (3 * N*V*T), the fp32 d_weight accumulator read +
//             written once per token tile (ceil(N/Nt) * 2 * V*H*4: the GEMM runs with beta = 1), the fp32 d_hidden
//             accumulator read + written once per vocab tile (ceil(V/Vt) * 2 * N*H*4), and the outputs written once.
// Arithmetic intensity for bf16 is then about 1 / (1/Vt + 1/Nt + 4/H) FLOP/byte forward and
// 1 / (2/Vt + 2/Nt + 2.3/H) backward. Against the H100 SXM ridge point (989 TFLOP/s / 3.35 TB/s ~ 295 FLOP/byte):
// at H = 4096 the shared defaults (Nt = 256, Vt = 2048) give ~190 and ~110, below the ridge (the weight is re-streamed
// every 256 tokens), while Nt = Vt = 8192 (bench_linear_ce_cuda's default) gives ~820 and ~950, where the GEMMs can
// approach the tensor-core roof (forward + backward = 8NHV FLOPs). So pass token_tile >= 4096 on a GPU; the
// workspace grows as Nt*Vt*(4 + T) bytes (384 MB at 8192 x 8192 bf16), see workspace_bytes().
//
// The bf16 path rounds the dlogits tile to bf16 before the gradient GEMMs (tensor cores take bf16 operands); the
// CPU path keeps it in fp32, so the two agree to bf16 rounding, not bit for bit.
//
// Vocabulary parallelism: pass a DeviceAllReduce (linear_ce_vocab_parallel_cuda.h binds one to lcplan::comm). Without
// one, a Problem that is a vocabulary shard is refused with std::invalid_argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/linear_ce/linear_ce.h"

namespace lcplan::linear_ce::cuda {

// In-place all-reduce of `count` device floats across the vocabulary-parallel group, stream-ordered: it must act
// after the work already queued on `stream` and before anything queued on `stream` after it returns.
using DeviceAllReduce = std::function<void(float* device_buf, size_t count, CrossRankOp op, cudaStream_t stream)>;

// Bytes of device workspace one forward or backward call needs (the larger of the two).
size_t workspace_bytes(const Problem& p, DType t, const Options& o);

// loss: N floats (Reduction::None) or 1; lse: N floats kept for the backward. Synchronises `stream` once at the end
// to check the targets (a target outside [0, vocab_total) that is not ignore_index throws std::invalid_argument).
void forward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
             const int64_t* targets, float* loss, float* lse, const Options& o, void* workspace,
             size_t workspace_size, cudaStream_t stream);
// Vocabulary-parallel forward: the per-token max and [sum-exp, target logit] are combined through `all_reduce`
// between the tile loop and the loss, exactly as the CPU path does. Every rank passes the same tokens and targets.
void forward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
             const int64_t* targets, float* loss, float* lse, const Options& o, const DeviceAllReduce& all_reduce,
             void* workspace, size_t workspace_size, cudaStream_t stream);

// grad_loss: N floats (Reduction::None) or 1. d_hidden [N x H], d_weight [vocab x H] in the input dtype, overwritten.
// Synchronises `stream` once at the end to check the targets, like the forward.
void backward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
              const int64_t* targets, const float* lse, const float* grad_loss, void* d_hidden, void* d_weight,
              const Options& o, void* workspace, size_t workspace_size, cudaStream_t stream);
// Vocabulary-parallel backward: d_weight holds this rank's rows; d_hidden is summed across ranks in fp32 through
// `all_reduce` before the bf16 rounding, so every rank gets the full gradient.
void backward(cublasHandle_t handle, const Problem& p, DType t, const void* hidden, const void* weight,
              const int64_t* targets, const float* lse, const float* grad_loss, void* d_hidden, void* d_weight,
              const Options& o, const DeviceAllReduce& all_reduce, void* workspace, size_t workspace_size,
              cudaStream_t stream);

}  // namespace lcplan::linear_ce::cuda
