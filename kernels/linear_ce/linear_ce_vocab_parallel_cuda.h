// Vocabulary-parallel linear cross-entropy on GPUs over an lcplan::comm communicator: the CUDA launchers with their
// DeviceAllReduce bound to comm::all_reduce. Same contract as linear_ce_vocab_parallel.h (every rank passes the same
// hidden states and targets and its own weight rows; every rank gets the full loss, lse and d_hidden).
#pragma once

#include "kernels/comm/comm.h"
#include "kernels/linear_ce/linear_ce_cuda.h"

namespace lcplan::linear_ce::cuda {

// The DeviceAllReduce backed by `c`. NCCL reduces device memory in place on c.stream, fenced with events against
// the caller's stream; MPI reduces host memory, so the buffer is staged through the host (correct, not fast).
DeviceAllReduce comm_all_reduce(const comm::Comm& c);

// Both first copy the targets to the host and run check_vocab_parallel (collective over c's MPI side), so a bad
// input on one rank makes every rank throw std::invalid_argument instead of hanging in a collective.
void forward_vocab_parallel(const comm::Comm& c, cublasHandle_t handle, const Problem& p, DType t, const void* hidden,
                            const void* weight, const int64_t* targets, float* loss, float* lse, const Options& o,
                            void* workspace, size_t workspace_size, cudaStream_t stream);
void backward_vocab_parallel(const comm::Comm& c, cublasHandle_t handle, const Problem& p, DType t,
                             const void* hidden, const void* weight, const int64_t* targets, const float* lse,
                             const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                             void* workspace, size_t workspace_size, cudaStream_t stream);

}  // namespace lcplan::linear_ce::cuda
