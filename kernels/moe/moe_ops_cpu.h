// The CPU side of the ops moe_pass.h runs on (its header lists them): the kernels of moe_kernels_cpu.h, the
// fixed-order fp32 GEMMs of cpu_gemm.h, and the schedule's runner: compute steps run inline, the all-to-all steps are
// non-blocking MPI requests, polled (and the next one started) between GEMM row blocks, so one chunk's all-to-all
// runs while another chunk computes. The CPU layer (moe_cpu.h) and lcplan-exec's HostOps add the buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/comm/comm.h"
#include "kernels/moe/cpu_gemm.h"
#include "kernels/moe/moe_kernels_cpu.h"
#include "kernels/moe/moe_layer.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::moe::cpu {

class MoeOps {
 public:
  ExecOptions exec;                        // overlap and the GEMM row block between polls
  std::vector<StepTime>* times = nullptr;  // each step's [start, end) of the last run_steps, when set

  // C[rows x n] = A[rows x k] B[k x n]; C = A B^T with B [n x k]; G[k x n] += A^T D (rows in ascending order).
  void gemm32(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n) {
    gemm_rows(A, B, C, rows, int(k), int(n), poll(), exec.poll_rows);
  }
  void gemm32_bt(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n) {
    gemm_rows_bt(A, B, C, rows, int(k), int(n), poll(), exec.poll_rows);
  }
  void gemm32_at(const float* A, const float* D, float* G, int64_t rows, int64_t k, int64_t n) {
    gemm_at(A, D, G, rows, int(k), int(n), poll(), exec.poll_rows);
  }

  void route(const float* logits, const float* bias, const RouterParams& p, int tokens, float* scores, int* idx,
             float* w) {
    cpu::route(logits, bias, p, tokens, scores, idx, w);
  }
  void route_bwd(const float* scores, const int* idx, const float* dw, const RouterParams& p, int tokens,
                 float* dlogits) {
    cpu::route_bwd(scores, idx, dw, p, tokens, dlogits);
  }
  std::vector<int> chunk_counts(const int* idx, int top_k, int experts, const std::vector<int>& bounds) {
    std::vector<int> counts((bounds.size() - 1) * size_t(experts));
    cpu::chunk_counts(idx, top_k, experts, bounds, counts.data());
    return counts;
  }
  void expert_major_rows(const int* expert_of_slot, int n, int experts, int* row_of_slot) {
    cpu::expert_major_rows(expert_of_slot, n, experts, row_of_slot);
  }
  void permute(const float* x, const int* rows, int tokens, int top_k, int hidden, float* xp) {
    cpu::permute(x, rows, tokens, top_k, hidden, xp);
  }
  void unpermute(const float* yp, const int* rows, const float* w, int tokens, int top_k, int hidden,
                 const float* shared, const float* gate, float* out) {
    cpu::unpermute(yp, rows, w, tokens, top_k, hidden, shared, gate, out);
  }
  void unpermute_bwd(const float* dout, const float* yp, const int* rows, const float* w, int tokens, int top_k,
                     int hidden, float* dyp, float* dw) {
    cpu::unpermute_bwd(dout, yp, rows, w, tokens, top_k, hidden, dyp, dw);
  }
  void swiglu(const float* h1, int64_t rows, int ffn, float* act) { cpu::swiglu(h1, rows, ffn, act); }
  void swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, float* dh1) {
    cpu::swiglu_bwd(h1, dact, rows, ffn, dh1);
  }
  void add(const float* a, const float* b, int64_t n, float* out) { cpu::add(a, b, n, out); }
  void copy_blocks(const float* in, float* out, const int64_t* blocks, int nblocks, int64_t, int hidden,
                   bool to_expert_major) {
    cpu::copy_blocks(in, out, blocks, nblocks, hidden, to_expert_major);
  }
  void shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate) {
    cpu::shared_gate(x, g, tokens, hidden, sgate);
  }
  void shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, float* dso,
                       float* dz) {
    cpu::shared_gate_bwd(dout, sout, sgate, tokens, hidden, dso, dz);
  }

  // Runs a step list (chunk_schedule.h) on the two logical streams; issue(step) does one step's work.
  void run_steps(const std::vector<Step>& steps, const std::function<void(const Step&)>& issue);
  // The schedule's all-to-all: inside a comm step of run_steps, a non-blocking request the runner polls.
  void all_to_all_step(const comm::Comm& c, const float* send, const size_t* send_counts, const size_t* send_displs,
                       float* recv, const size_t* recv_counts, const size_t* recv_displs);

 private:
  const Poll& poll() const { return poll_ ? *poll_ : no_poll_; }
  const Poll* poll_ = nullptr;         // the runner's progress poll while a compute step runs
  comm::Request* pending_ = nullptr;   // where a comm step's request goes while it is issued
  Poll no_poll_;
};

}  // namespace lcplan::moe::cpu
