// The GPU backend's decoder layers: executor/layers/'s orchestration (the one the host layers run and the paired and
// memory tests check) on DeviceOps, which calls the device ops of ops_cuda.h, the CUDA attention and linear-CE kernels
// and NCCL groups, every call on one stream. Every tensor is a DeviceBuf charged to the tracker's categories exactly
// where the host layer charges its Buf, so peaks per phase come from the same code.
//
// Every layer the host runs: full attention (GQA, partial RoPE, output gate, q/k norm, q/k/v biases, sliding windows,
// load-balanced context parallelism), gated DeltaNet (with its CP state passing), multi-head latent attention, dense
// SwiGLU MLPs and the expert-parallel MoE FFN with its chunked all-to-alls and expert tensor parallelism
// (moe_ops_cuda.cpp); the embedding and the linear-CE loss; TP + sequence parallelism (fp32 partial sums reduce-scattered,
// where the host reduces fp64) and every recompute mode. The materialized-logits loss is the linear-CE kernel with one
// tile of every local token by the whole vocabulary shard: the fp32 logits held at once, as Megatron's vocab-parallel
// cross-entropy holds them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "executor/device_buf_cuda.h"
#include "executor/layers.h"
#include "kernels/attention/attention.h"
#include "kernels/linear_attention/linear_attention.h"
#include "kernels/moe/moe_math.h"
#include "parallel/chunk_schedule.h"

namespace lcplan::exec::cuda {

using DeviceLayerSaved = BasicLayerSaved<DeviceBuf>;

// The device backend of executor/layers/ (layers/common.h lists the members). Device pointers throughout; every call
// is enqueued on `stream`, and c.pg's groups must be NCCL groups on that stream. Scratch (GEMM widening, norm and
// attention backward workspaces, linear-CE tiles) is a DeviceBuf per call, charged while the call runs.
struct DeviceOps {
  template <class T>
  using Buf = DeviceBuf<T>;
  Tracker& tr;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  // The MoE layers' all-to-alls (moe_ops_cuda.cpp): a second stream so one EP chunk's all-to-all overlaps another's expert
  // GEMMs, as the plan's chunk schedule says; null runs them on `stream`, in the schedule's order.
  cudaStream_t comm_stream = nullptr;

  Buf<float> ws(size_t n) { return Buf<float>(tr, Category::Workspace, n); }
  Buf<bf16> save16(const float* x, size_t n);
  Buf<float> save32(const float* x, size_t n);
  Buf<float> load(const Buf<bf16>& b) { return widen(b.data(), b.size()); }
  Buf<float> widen(const bf16* x, size_t n);

  void round(float* x, size_t n);
  void to_bf16(const float* x, bf16* y, size_t n);
  void copy(const float* src, size_t n, float* dst);
  void accumulate(const float* src, float* dst, size_t n);
  void residual(const float* a, const float* b, float* out, size_t n);
  void cols_out(const float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, float* out);
  void cols_in(float* m, int64_t cols, int64_t r0, int64_t rows, int64_t c0, int64_t n, const float* in);

  void matmul(const float* x, const bf16* W, float* y, int64_t rows, int64_t k, int64_t n);
  void matmul_bwd(const float* x, const bf16* W, const float* dy, float* dx, float* dW, int64_t rows, int64_t k,
                  int64_t n);
  void row_parallel(Ctx& c, const float* x, const bf16* W, float* y, int64_t k, int64_t n);
  void col_parallel_bwd(Ctx& c, const float* x_all, const bf16* W, const float* dy, float* dx, float* dW, int64_t k,
                        int64_t n);

  void rmsnorm(const float* x, const bf16* w, float* y, int64_t rows, int64_t h);
  void rmsnorm_bwd(const float* x, const bf16* w, const float* dy, float* dx, float* dw, int64_t rows, int64_t h,
                   bool accumulate_dx);
  void output_gate(const float* o, const float* gate, float* go, size_t n);
  void add_bias(float* y, const bf16* b, int64_t rows, int64_t n);
  void bias_bwd(const float* dy, int64_t rows, int64_t n, float* db);
  void output_gate_bwd(const float* dgo, const float* o, const float* gate, float* d_o, float* d_gate, size_t n);
  void swiglu_fwd(const float* h1, float* act, int64_t rows, int64_t f);
  void swiglu_back(const float* h1, const float* dact, float* dh1, int64_t rows, int64_t f);
  void embedding_rows(const bf16* table, const int64_t* tokens, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                      float* out);
  void embedding_rows_bwd(const int64_t* tokens, const float* dy, int64_t T, int64_t h, int64_t V0, int64_t Vl,
                          float* g);
  void embed_rows16(Ctx& c, const bf16* table, const int64_t* tokens, bf16* x);

  void rope(int64_t len, int64_t heads, int64_t hd, float* x, const attention::RopeOptions& o, bool backward);
  void attention_fwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v, float* o,
                     float* lse, const attention::Options& opt);
  void attention_bwd(Ctx& c, const attention::Shape& s, const float* q, const float* k, const float* v,
                     const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv,
                     const attention::Options& opt);
  double cross_entropy(Ctx& c, const float* h, const float* W, const int64_t* targets, float gl, float* lse,
                       Buf<float>& dh, Buf<float>& dW);

  // Gated DeltaNet: ops_cuda.h's gates and gated norm, kernels/linear_attention's CUDA conv1d and delta rule.
  void gdn_gates(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                 int64_t T, int64_t lv, float* gb);
  void gdn_gates_bwd(const float* proj, int64_t P, int64_t acol, int64_t bcol, const bf16* a_log, const bf16* dt_bias,
                     const float* gb, const float* dg, const float* dbeta, int64_t r0, int64_t n, int64_t lv,
                     float* dproj, float* d_dt_bias, float* d_a_log);
  void gated_norm(const float* x, const float* z, const bf16* w, float* y, int64_t rows, int64_t heads, int64_t dv);
  void gated_norm_bwd(const float* x, const float* z, const bf16* w, const float* dy, float* dx, float* dz, float* dw,
                      int64_t rows, int64_t heads, int64_t dv);
  void conv1d_fwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w, float* y);
  void conv1d_history(const linear_attention::Conv& cv, const float* x, const float* hist, float* next);
  void conv1d_bwd(const linear_attention::Conv& cv, const float* x, const float* hist, const float* w, const float* dy,
                  float* dx, float* d_hist, float* dw);
  void la_fwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v, const float* g,
              const float* beta, const float* state_in, float* o, float* state_out, const linear_attention::Options& opt);
  void la_bwd(const linear_attention::Shape& s, const float* q, const float* k, const float* v, const float* g,
              const float* beta, const float* state_in, const float* d_o, const float* d_state_out, float* dq,
              float* dk, float* dv, float* dg, float* dbeta, float* d_state_in, const linear_attention::Options& opt);

  // The MoE FFN (layers/moe.h on kernels/moe/moe_pass.h; moe_ops_cuda.cpp): its state buffers, kernels/moe's CUDA
  // kernels, fp32 cuBLAS GEMMs without TF32 (routing picks the experts the host picks) and the chunk schedule on two
  // streams: the all-to-alls on comm_stream, everything else on `stream`, cross-stream dependencies as events.
  template <class T>
  Buf<T> moe_buf(size_t n) {
    return Buf<T>(tr, Category::MoeBuffers, n);
  }
  Buf<int64_t> upload(const std::vector<int64_t>& v);
  Buf<int64_t> save_counts(const std::vector<int64_t>& v);
  std::vector<int64_t> load_counts(const Buf<int64_t>& b);
  void to_f32(const bf16* x, float* y, size_t n);
  void gemm32(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n);
  void gemm32_bt(const float* A, const float* B, float* C, int64_t rows, int64_t k, int64_t n);
  void gemm32_at(const float* A, const float* D, float* G, int64_t rows, int64_t k, int64_t n);
  void route(const float* logits, const float* bias, const moe::RouterParams& p, int tokens, float* scores, int* idx,
             float* w);
  void route_bwd(const float* scores, const int* idx, const float* dw, const moe::RouterParams& p, int tokens,
                 float* dlogits);
  std::vector<int> chunk_counts(const int* idx, int top_k, int experts, const std::vector<int>& bounds);
  void expert_major_rows(const int* expert_of_slot, int n, int experts, int* row_of_slot);
  void permute(const float* x, const int* rows, int tokens, int top_k, int hidden, float* xp);
  void unpermute(const float* yp, const int* rows, const float* w, int tokens, int top_k, int hidden,
                 const float* shared, const float* gate, float* out);
  void unpermute_bwd(const float* dout, const float* yp, const int* rows, const float* w, int tokens, int top_k,
                     int hidden, float* dyp, float* dw);
  void swiglu(const float* h1, int64_t rows, int ffn, float* act);
  void swiglu_bwd(const float* h1, const float* dact, int64_t rows, int ffn, float* dh1);
  void add(const float* a, const float* b, int64_t n, float* out);
  void copy_blocks(const float* in, float* out, const int64_t* blocks, int nblocks, int64_t max_rows, int hidden,
                   bool to_expert_major);
  void shared_gate(const float* x, const float* g, int tokens, int hidden, float* sgate);
  void shared_gate_bwd(const float* dout, const float* sout, const float* sgate, int tokens, int hidden, float* dso,
                       float* dz);
  void run_steps(const std::vector<moe::Step>& steps, const std::function<void(const moe::Step&)>& issue);
  void all_to_all_step(const comm::Comm& c, const float* send, const size_t* send_counts, const size_t* send_displs,
                       float* recv, const size_t* recv_counts, const size_t* recv_displs);
  cudaStream_t step_stream = nullptr;  // the comm step run_steps is issuing: its stream
};

// layers.h's contracts on the device: every pointer (weights, gradients, activations, tokens, targets) is device
// memory; the returned loss is on the host (the call waits for the stream to read it).
void layer_forward(DeviceOps& o, Ctx& c, const UnitLayout& u, const UnitView& w, const LayerSpec& l, Keep keep,
                   DeviceLayerSaved& sv, float* out);
void layer_backward(DeviceOps& o, Ctx& c, const UnitLayout& u, const UnitView& w, const UnitGrad& g,
                    const LayerSpec& l, Keep keep, DeviceLayerSaved& sv, const float* dout, float* dx);
double loss_forward_backward(DeviceOps& o, Ctx& c, const bf16* final_norm_w, const bf16* head_w, float* final_norm_g,
                             float* head_g, const float* x, const int64_t* targets, double grad_scale, float* dx);
void embedding_forward(DeviceOps& o, Ctx& c, const bf16* table, const int64_t* tokens, bf16* x);
void embedding_backward(DeviceOps& o, Ctx& c, const int64_t* tokens, const float* dx, float* g);

}  // namespace lcplan::exec::cuda
