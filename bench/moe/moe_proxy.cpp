// Single-layer proxy of chunked EP overlap (the article's section 2.4 table), on CPUs under mpirun:
// forward + backward of one MoE layer of a zoo model, scaled down by flags, no-chunk vs chunked.
//   mpirun -np 2 bench/moe/moe_proxy --model qwen3.5-35b-a3b --ep 2 --seqs 4k,8k,16k,32k,64k
// These are CPU numbers (MPI over shared memory, Eigen GEMMs); they are not GPU timings.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "estimator/rank_layout.h"
#include "kernels/comm/comm.h"
#include "kernels/moe/moe_layer.h"
#include "models/data_dir.h"
#include "models/user_error.h"
#include "models/zoo.h"
#include "bench/moe/proxy_common.h"

namespace {

using namespace lcplan;
using moe_proxy::label_seq;
using moe_proxy::parse_tokens;

struct Timing {
  double fwd = 0, bwd = 0;  // seconds, slowest rank, median over iterations
};

Timing time_layer(const comm::Comm& ep, const moe::MoeConfig& c, const moe::MoeWeights& w,
                  const moe::ChunkSchedule& s, bool overlap, int tokens, int warmup, int iters) {
  std::vector<float> x(size_t(tokens) * c.hidden), out(x.size()), dout(x.size()), dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    dout[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
  }
  moe::MoeSaved saved;
  moe::MoeWeights grads;
  const moe::ExecOptions o{overlap, 64};
  std::vector<double> f, b;
  for (int it = 0; it < warmup + iters; ++it) {
    comm::barrier(ep);
    double t0 = MPI_Wtime();
    moe::moe_forward(ep, c, w, s, x.data(), tokens, out.data(), saved, o);
    double t1 = MPI_Wtime();
    moe::moe_backward(ep, c, w, s, saved, dout.data(), dx.data(), grads, o);
    double t[2] = {t1 - t0, MPI_Wtime() - t1};
    MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, ep.mpi);  // a step is as slow as its slowest rank
    if (it >= warmup) {
      f.push_back(t[0]);
      b.push_back(t[1]);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(f), median(b)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chunked expert-parallel single-layer proxy (CPU, MPI). Run under mpirun."};
  std::string model = "qwen3.5-35b-a3b";
  int hidden = 128, experts = 16, ffn = 64, shared_ffn = -1, top_k = 4, ep_size = 0, chunks = 2, warmup = 1,
      iters = 3;
  std::vector<std::string> seqs = {"4k", "8k", "16k", "32k", "64k"};
  std::vector<double> weights;
  bool print_schedule = false;
  app.add_option("--model", model, "zoo model whose MoE layer is proxied (router, shared expert, gate)");
  app.add_option("--hidden", hidden, "hidden size (scaled down from the model)");
  app.add_option("--experts", experts, "routed experts (scaled down)");
  app.add_option("--ffn", ffn, "intermediate size of one routed expert (scaled down)");
  app.add_option("--shared-ffn", shared_ffn, "shared expert intermediate size; default: same as --ffn when the model has one");
  app.add_option("--top-k", top_k, "experts per token");
  app.add_option("--ep", ep_size, "expert-parallel size (default: all ranks)");
  app.add_option("--chunks", chunks, "chunks of the chunked run (1..4)");
  app.add_option("--chunk-weights", weights, "relative token share per chunk (asymmetric chunks)")->delimiter(',');
  app.add_option("--seqs", seqs, "local sequence lengths (tokens per rank), e.g. 4k,8k")->delimiter(',');
  app.add_option("--warmup", warmup, "untimed steps per point");
  app.add_option("--iters", iters, "timed steps per point (the median is reported)");
  app.add_flag("--print-schedule", print_schedule, "print the chunked schedule and exit");
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  try {
    const moe::ChunkSchedule chunked = moe::make_chunk_schedule(chunks, weights);
    if (print_schedule) {
      if (rank == 0) std::printf("%s", moe::format_schedule(chunked).c_str());
      MPI_Finalize();
      return 0;
    }
    if (iters < 1 || warmup < 0) throw UserError("--iters must be at least 1 and --warmup at least 0");
    comm::Comm world = comm::world_mpi();
    if (ep_size == 0) ep_size = world.size;
    RankLayout layout;
    try {
      layout = make_rank_layout(world.size, 1, 1, 1, ep_size, 1);
    } catch (const std::invalid_argument& e) {
      throw UserError(std::string("--ep ") + std::to_string(ep_size) + " does not fit " +
                      std::to_string(world.size) + " ranks: " + e.what());
    }
    comm::Comm ep = comm::split(world, group_ranks(layout, Group::EP, world.rank));

    const ModelSpec spec = load_model(model, data_dir());
    const moe::MoeConfig c =
        moe_proxy::layer_config(spec, hidden, experts, ffn, top_k, shared_ffn >= 0 ? shared_ffn : ffn);
    std::vector<int> tokens;
    for (const auto& s : seqs) tokens.push_back(parse_tokens(s));
    const moe::MoeWeights w = moe::make_weights(c, ep.rank, ep.size, 42);  // throws: EP must divide experts
    const moe::ChunkSchedule nochunk = moe::make_chunk_schedule(1);

    if (world.rank == 0) {
      std::printf("CPU proxy (not GPU numbers): one MoE layer shaped like %s, scaled to hidden %d, %d experts "
                  "(top-%d, %s), expert ffn %d, shared ffn %d%s; EP=%d over MPI (%d ranks), fp32 Eigen GEMMs, "
                  "forward + backward, median of %d steps.\n",
                  spec.name.c_str(), c.hidden, c.experts, c.top_k,
                  c.router == moe::Router::SoftmaxTopK ? "softmax" : "sigmoid group-limited", c.expert_ffn,
                  c.shared_ffn, c.shared_gate ? " (gated)" : "", ep.size, world.size, iters);
      std::printf("no-chunk: one chunk, each all-to-all waited on at once (serial); chunked: chunk%d%s on "
                  "non-blocking MPI overlapped with the GEMMs. speedup = (no-chunk - chunked) / no-chunk, as the article.\n\n",
                  chunks, weights.empty() ? "" : " (asymmetric)");
      std::printf("| local seq | no-chunk step ms | chunked step ms | speedup | fwd ms no-chunk / chunked | bwd ms no-chunk / chunked |\n");
      std::printf("|---|---|---|---|---|---|\n");
    }
    for (int t : tokens) {
      const Timing a = time_layer(ep, c, w, nochunk, false, t, warmup, iters);
      const Timing b = time_layer(ep, c, w, chunked, true, t, warmup, iters);
      const double na = (a.fwd + a.bwd) * 1e3, nb = (b.fwd + b.bwd) * 1e3;
      if (world.rank == 0) {
        std::printf("| %s | %.3f | %.3f | %+.2f%% | %.2f / %.2f | %.2f / %.2f |\n", label_seq(t).c_str(), na, nb,
                    100.0 * (na - nb) / na, a.fwd * 1e3, b.fwd * 1e3, a.bwd * 1e3, b.bwd * 1e3);
        std::fflush(stdout);
      }
    }
    comm::free_comm(ep);
    comm::free_comm(world);
  } catch (const std::exception& e) {
    // UserError and std::invalid_argument are input mistakes; each rank reports (collective checks make them agree).
    std::fprintf(stderr, "moe_proxy: error (rank %d): %s\n", rank, e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
