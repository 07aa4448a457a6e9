// The GPU backend's step (executor/executor_cuda.h) against the CPU executor on the same scaled plans: one rank per
// GPU, the two-rank cases in executor_step_cuda_test and the one-rank cases in executor_step_cuda_1gpu_test
// (`lcplan selftest --gpu` runs both from gpu_tests.tsv). Both run step_impl.h, so the same data, schedule
// and sharding meet different ops: the loss and gradient norm of every step agree within the device's fp32-GEMM
// rounding, and the bytes every rank holds of parameters, gradients, optimizer state and activations at each phase's
// peak are the same (workspace and logits differ: the device's kernels take their own scratch). Skips itself without
// a usable device per rank; the host half runs everywhere.
//
// cp2 runs load-balanced context parallelism: the K/V exchange (layers/core_attention.h cp_gather_kv) on NCCL against
// MPI.
// pp2_1f1b and pp2_vpp2 run the pipeline's stage-to-stage messages over NCCL links (comm::make_pipe_links): sends on
// a stream per outgoing link, receives on the compute stream. gdn_* put Qwen3.5's gated DeltaNet in the first layer.
// moe_* run Qwen3.5-35B-A3B itself, scaled (a gated DeltaNet and a gated-attention layer, both MoE): routing, EP
// chunks, the all-to-alls over NCCL against MPI, the gated shared expert, TP-sharded in moe_tp2, expert tensor
// parallelism in moe_etp2 (executor/layers/moe.h on executor/moe_ops_cuda.cpp).
//
// Tolerances: loss 1e-3 relative (summed over tokens in fp32 on both), gradient norm 2e-2 relative (fp32 against
// fp64 GEMMs, bf16 storage), after one Adam step too.
#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <cmath>
#include <string>

#include "executor/executor.h"
#include "executor/executor_cuda.h"
#include "executor/scale.h"
#include "kernels/comm/helpers.h"
#include "tests/comm/gpu_ranks.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

struct StepCase {
  const char* name;
  PlanArgs args;
  int layers = 2;
  bool gated_deltanet = false;  // the first layer's attention replaced by Qwen3.5's gated DeltaNet
  const char* model = "llama-3.1-8b";  // the zoo model scaled (layers: the first `layers` of each kind for Qwen3.5)
};
constexpr const char* kQwen = "qwen3.5-35b-a3b";

// Each binary runs the cases for its world size: executor_step_cuda_test on two ranks, executor_step_cuda_1gpu_test
// on one.
const StepCase kCases[] = {
    {"one_gpu_selective", {.gpus = 1, .seq = 4096, .recompute = Recompute::Selective}},
    {"one_gpu_materialized_logits", {.gpus = 1, .seq = 4096, .linear_ce = false}},
    {"one_gpu_gdn_full_recompute", {.gpus = 1, .seq = 4096, .recompute = Recompute::Full}, 2, true},
    {"dp2", {.gpus = 2, .seq = 4096}},
    {"tp2", {.gpus = 2, .tp = 2, .seq = 4096}},
    {"cp2", {.gpus = 2, .cp = 2, .seq = 4096}},
    {"dp2_dist_opt_selective", {.gpus = 2, .seq = 4096, .sharding = OptimizerSharding::DistOpt,
                                .recompute = Recompute::Selective}},
    {"dp2_fsdp_full_recompute", {.gpus = 2, .seq = 4096, .sharding = OptimizerSharding::Fsdp,
                                 .recompute = Recompute::Full}},
    // Materialized logits, vocabulary-parallel: the [tokens x vocab / 2] fp32 logits in one tile.
    {"tp2_materialized_logits", {.gpus = 2, .tp = 2, .seq = 4096, .linear_ce = false}},
    {"pp2_1f1b", {.gpus = 2, .global_batch = 4, .pp = 2, .seq = 4096}},
    // Two interleaved stages: both links of the pair carry messages each way (the wrap to the next chunk).
    {"pp2_vpp2", {.gpus = 2, .global_batch = 4, .pp = 2, .vpp = 2, .seq = 4096}, 4},
    // Gated DeltaNet: heads split over TP, and the state handed along the CP ranks (NCCL send / recv on the stream).
    {"gdn_tp2", {.gpus = 2, .tp = 2, .seq = 4096}, 2, true},
    {"gdn_cp2_selective", {.gpus = 2, .cp = 2, .seq = 4096, .recompute = Recompute::Selective}, 2, true},
    {"one_gpu_moe_chunks2_selective", {.gpus = 1, .ep_chunks = 2, .seq = 8192, .recompute = Recompute::Selective}, 1,
     false, kQwen},
    {"moe_ep2_chunks2_dist_opt", {.gpus = 2, .ep = 2, .ep_chunks = 2, .seq = 8192,
                                  .sharding = OptimizerSharding::DistOpt}, 1, false, kQwen},
    {"moe_ep2_full_recompute", {.gpus = 2, .ep = 2, .seq = 8192, .recompute = Recompute::Full}, 1, false, kQwen},
    {"moe_cp2_ep2", {.gpus = 2, .cp = 2, .ep = 2, .seq = 8192}, 1, false, kQwen},
    {"moe_pp2", {.gpus = 2, .global_batch = 4, .pp = 2, .seq = 8192}, 1, false, kQwen},
    // The shared expert as Megatron's SharedExpertMLP (column/row-parallel over TP), the routed experts on each rank's
    // sequence-parallel rows.
    {"moe_tp2_selective", {.gpus = 2, .tp = 2, .seq = 8192, .recompute = Recompute::Selective}, 1, false, kQwen},
    // Expert tensor parallelism: each chunk's rows gathered over ETP, half the FFN columns per rank, partial outputs
    // reduce-scattered back.
    {"moe_etp2_chunks2_full",
     {.gpus = 2, .ep_chunks = 2, .etp = 2, .seq = 8192, .recompute = Recompute::Full},
     1,
     false,
     kQwen},
    // DeepSeek-V3 scaled: MLA (query compression, the shared rope key, v padded for the core attention) with dense
    // and MoE layers (the sigmoid group-limited router), on one GPU, under TP and under CP with EP.
    {"one_gpu_mla_selective", {.gpus = 1, .seq = 8192, .recompute = Recompute::Selective}, 1, false, "deepseek-v3"},
    {"mla_tp2", {.gpus = 2, .tp = 2, .seq = 8192}, 1, false, "deepseek-v3"},
    {"mla_cp2_ep2", {.gpus = 2, .cp = 2, .ep = 2, .seq = 8192}, 1, false, "deepseek-v3"},
    // GLM-4.5 scaled: q/k/v biases (column-parallel under TP).
    {"glm_tp2", {.gpus = 2, .tp = 2, .seq = 8192}, 1, false, "glm-4.5"},
};

ScaledCase scaled(const StepCase& k) {
  ScaledCase sc = executor_case(zoo(k.model), make_plan(k.model, k.args), {64, k.layers});
  if (k.gated_deltanet) {
    // Scaled under the case's own layout, so its heads split over the case's TP and CP.
    sc.model.linear = executor_case(zoo("qwen3.5-35b-a3b"), make_plan("qwen3.5-35b-a3b", k.args), {64, 1}).model.linear;
    sc.model.layers[0].mixer = MixerKind::LinearAttention;
  }
  return sc;
}

ExecOptions options() {
  ExecOptions o;
  o.steps = 2;
  o.workspace_reserve = exec_calibration().workspace_bytes;
  o.ce_vocab_tile = int64_t(exec_calibration().linear_ce_vocab_tile / 2);
  return o;
}

// The host half: every case runs on the CPU backend and trains (a finite loss that the Adam step lowers or keeps
// close, a positive gradient norm), so the device half compares against a real step.
TEST(StepCuda, HostStepsRun) {
  helpers::World w;
  int ran = 0;
  for (const StepCase& k : kCases) {
    if (k.args.gpus != w.c.size) continue;
    ++ran;
    const ScaledCase sc = scaled(k);
    ASSERT_EQ(executor_support_error(sc.model, sc.plan), "") << k.name;
    const ExecResult r = run_executor(w.c, sc.model, sc.plan, options());
    ASSERT_EQ(r.loss.size(), 2u) << k.name;
    EXPECT_TRUE(std::isfinite(r.loss[0]) && r.loss[0] > 0) << k.name;
    EXPECT_GT(r.grad_norm[0], 0) << k.name;
  }
  EXPECT_GE(ran, 3) << "run with mpirun -np 1 or -np 2";
}

TEST(StepCuda, MatchesTheCpuExecutor) {
  const std::string skip = lcplan::test::gpu_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  lcplan::test::pick_device();
  helpers::World w;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas = nullptr;
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetStream(blas, stream));
  comm::Comm nccl = comm::world_nccl(stream);
  for (const StepCase& k : kCases) {
    if (k.args.gpus != w.c.size) continue;
    const ScaledCase sc = scaled(k);
    const ExecResult h = run_executor(w.c, sc.model, sc.plan, options());
    const ExecResult d = cuda::run_executor(w.c, nccl, stream, blas, sc.model, sc.plan, options());
    ASSERT_EQ(d.loss.size(), h.loss.size()) << k.name;
    for (size_t s = 0; s < h.loss.size(); ++s) {
      EXPECT_NEAR(d.loss[s], h.loss[s], 1e-3 * std::abs(h.loss[s])) << k.name << " step " << s + 1 << " loss";
      EXPECT_NEAR(d.grad_norm[s], h.grad_norm[s], 2e-2 * h.grad_norm[s]) << k.name << " step " << s + 1 << " norm";
    }
    for (size_t r = 0; r < h.ranks.size(); ++r)
      for (int ph = 0; ph < kPhases; ++ph)
        for (Category c : {Category::Params, Category::Grads, Category::Optimizer, Category::FsdpBuffers,
                           Category::Activations}) {
          const int i = static_cast<int>(c);
          EXPECT_EQ(d.ranks[r].phases[ph].category_max.bytes[i], h.ranks[r].phases[ph].category_max.bytes[i])
              << k.name << " rank " << r << " phase " << to_string(Phase(ph)) << " " << category_key(c);
        }
  }
  comm::free_comm(nccl);
  CUBLAS_LOG(cublasDestroy(blas));
  CUDA_LOG(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace lcplan::exec::tests
