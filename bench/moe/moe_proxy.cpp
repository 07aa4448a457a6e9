// Single-layer proxy of chunked EP overlap (the article's section 2.4 table), on CPUs under mpirun:
// forward + backward of one MoE layer of a zoo model, scaled down by flags, no-chunk vs chunked.
//   mpirun -np 2 bench/moe/moe_proxy --model qwen3.5-35b-a3b --ep 2 --seqs 4k,8k,16k,32k,64k
// These are CPU numbers (MPI over shared memory, fixed-order fp32 GEMMs); they are not GPU timings.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/moe/proxy_common.h"
#include "parallel/rank_layout.h"
#include "kernels/comm/comm.h"
#include "kernels/comm/helpers.h"
#include "kernels/moe/moe_cpu.h"
#include "common/data_dir.h"
#include "common/user_error.h"
#include "models/zoo.h"

namespace {

using namespace lcplan;
using moe_proxy::label_seq;
using moe_proxy::parse_tokens;

// One way of running the layer; the table compares them at each sequence length.
struct Variant {
  const moe::ChunkSchedule* schedule;
  bool overlap;
  std::vector<double> fwd, bwd;  // seconds per timed step, slowest rank
};

struct Stats {
  double min = 0, spread = 0;  // min over steps; spread = (max - min) / min
};

Stats stats(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *lo > 0 ? (*hi - *lo) / *lo : 0};
}

std::vector<double> step_totals(const Variant& v) {
  std::vector<double> t(v.fwd.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = v.fwd[i] + v.bwd[i];
  return t;
}

// Times every variant `iters` times after `warmup` untimed rounds. The variants alternate inside each round (and
// the first one rotates), so drift of a shared, loaded machine lands on all of them alike.
void time_variants(const comm::Comm& ep, const moe::MoeConfig& c, const moe::MoeWeights& w, int tokens, int warmup,
                   int iters, std::vector<Variant>& vs) {
  std::vector<float> x(size_t(tokens) * c.hidden), out(x.size()), dout(x.size()), dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    dout[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
  }
  moe::MoeSaved saved;
  moe::MoeWeights grads;
  for (Variant& v : vs) v.fwd.clear(), v.bwd.clear();
  for (int it = 0; it < warmup + iters; ++it)
    for (size_t k = 0; k < vs.size(); ++k) {
      Variant& v = vs[(k + size_t(it)) % vs.size()];
      const moe::ExecOptions o{v.overlap, 64};
      comm::barrier(ep);
      const double t0 = MPI_Wtime();
      moe::moe_forward(ep, c, w, *v.schedule, x.data(), tokens, out.data(), saved, o);
      const double t1 = MPI_Wtime();
      moe::moe_backward(ep, c, w, *v.schedule, saved, dout.data(), dx.data(), grads, o);
      double t[2] = {t1 - t0, MPI_Wtime() - t1};
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, ep.mpi));  // a step is its slowest rank's
      if (it >= warmup) {
        v.fwd.push_back(t[0]);
        v.bwd.push_back(t[1]);
      }
    }
}

int run(int argc, char** argv, int rank) {
  CLI::App app{"Chunked expert-parallel single-layer proxy (CPU, MPI). Run under mpirun."};
  std::string model = "qwen3.5-35b-a3b";
  int hidden = 128, experts = 16, ffn = 64, shared_ffn = -1, top_k = 4, ep_size = 0, chunks = 2, warmup = 2,
      iters = 7;
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
  app.add_option("--warmup", warmup, "untimed rounds per point");
  app.add_option("--iters", iters, "timed rounds per point (min and spread are reported)");
  app.add_flag("--print-schedule", print_schedule, "print the chunked schedule and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return rank == 0 ? app.exit(e) : 0;  // --help: printed once
    throw UserError(e.what());                                       // a bad flag: reported by every rank
  }

  const moe::ChunkSchedule chunked = moe::make_chunk_schedule(chunks, weights);
  if (print_schedule) {
    if (rank == 0) std::printf("%s", moe::format_schedule(chunked).c_str());
    return 0;
  }
  if (iters < 1 || warmup < 0) throw UserError("--iters must be at least 1 and --warmup at least 0");
  comm::Comm world = comm::world_mpi();
  if (ep_size == 0) ep_size = world.size;
  RankLayout layout;
  try {
    layout = make_rank_layout(world.size, 1, 1, 1, ep_size, 1);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--ep ") + std::to_string(ep_size) + " does not fit " + std::to_string(world.size) +
                    " ranks: " + e.what());
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
                "(top-%d, %s), expert ffn %d, shared ffn %d%s; EP=%d over MPI (%d ranks), fp32 fixed-order GEMMs, "
                "forward + backward; min over %d alternating rounds (+spread = (max - min) / min).\n",
                spec.name.c_str(), c.hidden, c.experts, c.top_k,
                c.router == moe::Router::SoftmaxTopK ? "softmax" : "sigmoid group-limited", c.expert_ffn,
                c.shared_ffn, c.shared_gate ? " (gated)" : "", ep.size, world.size, iters);
    std::printf("serial: one chunk, each all-to-all waited on at once. no-chunk: one chunk, all-to-alls on "
                "non-blocking MPI polled during the GEMMs (overlap on). chunk%d%s: the same overlap, %d chunks.\n"
                "chunking gain = (no-chunk - chunk%d) / no-chunk, both with overlap on (the article's speedup); "
                "vs serial = (serial - chunk%d) / serial.\n\n",
                chunks, weights.empty() ? "" : " (asymmetric)", chunks, chunks, chunks);
    std::printf("| local seq | serial ms | no-chunk ms | chunk%d ms | chunking gain | vs serial | fwd ms no-chunk / "
                "chunk%d | bwd ms no-chunk / chunk%d |\n",
                chunks, chunks, chunks);
    std::printf("|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  for (int t : tokens) {
    std::vector<Variant> vs = {{&nochunk, false, {}, {}}, {&nochunk, true, {}, {}}, {&chunked, true, {}, {}}};
    time_variants(ep, c, w, t, warmup, iters, vs);
    const Stats serial = stats(step_totals(vs[0])), base = stats(step_totals(vs[1])), ch = stats(step_totals(vs[2]));
    if (world.rank == 0) {
      std::printf("| %s | %.3f (+%.0f%%) | %.3f (+%.0f%%) | %.3f (+%.0f%%) | %+.2f%% | %+.2f%% | %.2f / %.2f | "
                  "%.2f / %.2f |\n",
                  label_seq(t).c_str(), serial.min * 1e3, serial.spread * 100, base.min * 1e3, base.spread * 100,
                  ch.min * 1e3, ch.spread * 100, 100.0 * (base.min - ch.min) / base.min,
                  100.0 * (serial.min - ch.min) / serial.min, stats(vs[1].fwd).min * 1e3, stats(vs[2].fwd).min * 1e3,
                  stats(vs[1].bwd).min * 1e3, stats(vs[2].bwd).min * 1e3);
      std::fflush(stdout);
    }
  }
  comm::free_comm(ep);
  comm::free_comm(world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Input mistakes are reported by each rank (collective checks make them agree).
  return helpers::mpi_main(argc, argv, "moe_proxy", [&](int rank) { return run(argc, argv, rank); });
}
