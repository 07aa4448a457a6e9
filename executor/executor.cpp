#include "executor/executor.h"

#include <chrono>
#include <ctime>
#include <cmath>
#include <stdexcept>

#include "common/user_error.h"
#include "estimator/plan_rules.h"
#include "executor/exec_model.h"
#include "executor/layers.h"
#include "executor/ops.h"
#include "executor/scale.h"
#include "kernels/comm/groups.h"

namespace lcplan::exec {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double cpu_now() { return double(std::clock()) / CLOCKS_PER_SEC; }  // this process's CPU time

// FSDP's two gather buffers (the current unit and the prefetched next one) and the unsharded gradient of one unit,
// each sized to the largest unit (Megatron-FSDP's double buffer): the estimator's fsdp_buffers.
struct Fsdp {
  ParamStore& ps;
  std::array<Buf<bf16>, 2> slot;
  std::array<int, 2> held{-1, -1};
  std::array<UnitView, 2> views{};
  Buf<float> grad;

  UnitView fetch(int unit, int s) {
    if (held[s] != unit) {
      views[s] = ps.gather(unit, slot[s].data());
      held[s] = unit;
    }
    return views[s];
  }
  // Unit order[i] in slot i % 2, and (prefetch) order[i + 1] gathered into the other slot ahead of its use.
  UnitView at(const std::vector<int>& order, size_t i, bool prefetch) {
    const UnitView v = fetch(order[i], int(i % 2));
    if (prefetch && i + 1 < order.size() && order[i + 1] >= 0) fetch(order[i + 1], int((i + 1) % 2));
    return v;
  }
};

Keep keep_of(const Plan& p, int layer) {
  switch (p.recompute) {
    case Recompute::None: return Keep::All;
    case Recompute::Selective: return Keep::Selective;
    case Recompute::Full:  // Megatron's block method: the first recompute_layers layers (0 = all) of the stage
      return p.recompute_layers == 0 || layer < p.recompute_layers ? Keep::InputOnly : Keep::All;
  }
  return Keep::All;
}

constexpr int kReportDoubles = 1 + kPhases * (1 + 2 * kCategories) + 1 + kPhases + 4;

std::vector<double> pack(const RankReport& r) {
  std::vector<double> v;
  v.push_back(r.rank);
  for (const PhasePeak& p : r.phases) {
    v.push_back(p.seen ? 1 : 0);
    for (double b : p.at_peak.bytes) v.push_back(b);
    for (double b : p.category_max.bytes) v.push_back(b);
  }
  v.push_back(r.workspace_high_water);
  for (double s : r.phase_seconds) v.push_back(s);
  v.push_back(r.moe_rows_received);
  v.push_back(r.moe_rows_sent);
  v.push_back(r.tracker_ops);
  v.push_back(r.cpu_seconds);
  return v;
}

RankReport unpack(const double* v) {
  RankReport r;
  size_t i = 0;
  r.rank = int(v[i++]);
  for (PhasePeak& p : r.phases) {
    p.seen = v[i++] != 0;
    for (double& b : p.at_peak.bytes) b = v[i++];
    for (double& b : p.category_max.bytes) b = v[i++];
  }
  r.workspace_high_water = v[i++];
  for (double& s : r.phase_seconds) s = v[i++];
  r.moe_rows_received = v[i++];
  r.moe_rows_sent = v[i++];
  r.tracker_ops = v[i++];
  r.cpu_seconds = v[i++];
  return r;
}

}  // namespace

std::pair<int, Phase> job_peak(const ExecResult& r) {
  int rank = 0;
  Phase ph = Phase::Forward;
  double best = -1;
  for (const RankReport& rr : r.ranks)
    for (int p = 0; p < kPhases; ++p)
      if (rr.phases[p].seen && rr.phases[p].at_peak.total() > best) {
        best = rr.phases[p].at_peak.total();
        rank = rr.rank;
        ph = Phase(p);
      }
  return {rank, ph};
}

ExecResult run_executor(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o) {
  const auto t_setup = Clock::now();
  if (const std::string e = executor_support_error(m, p); !e.empty()) throw UserError(e);
  require_valid_plan(m, p);
  if (p.gpus != world.size)
    throw UserError("the plan is for gpus = " + std::to_string(p.gpus) + " ranks but the job has " +
                    std::to_string(world.size) + "; launch lcplan-exec with mpirun -np " + std::to_string(p.gpus));
  if (o.steps < 1) throw UserError("--steps " + std::to_string(o.steps) + " must be at least 1");
  const Parallel& q = p.parallel;
  const RankLayout layout = make_rank_layout(p.gpus, q.tp, q.pp, q.cp, q.ep, q.etp);
  comm::ProcessGroups pg = comm::make_process_groups(world, layout);
  struct FreeGroups {
    comm::ProcessGroups& g;
    ~FreeGroups() {
      try {
        comm::free_groups(g);
      } catch (...) {
      }
    }
  } free_groups_at_exit{pg};

  Tracker tr(o.workspace_reserve);
  const Dims d = make_dims(m);
  const bool has_moe = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
  Ctx c{tr, d, pg};
  c.seq = p.seq_len;
  c.mb = p.micro_batch;
  c.cp = q.cp;
  c.cp_rank = pg.cp.rank;
  c.seq_local = p.seq_len / q.cp;
  c.chunks = q.cp > 1 ? 2 : 1;
  c.chunk_len = c.seq_local / c.chunks;
  c.tokens = int64_t(c.mb) * c.seq_local;
  c.rope_theta = o.rope_theta;
  c.linear_ce = p.linear_ce;
  c.ce_vocab_tile = o.ce_vocab_tile;
  if (has_moe) c.sched = moe::make_chunk_schedule(std::max(1, p.moe.ep_chunks), {}, d.moe.shared_ffn > 0);
  for (const LayerSpec& l : m.layers)
    if (l.mixer == MixerKind::LinearAttention && c.cp > 1 && c.chunk_len < d.conv - 1)
      throw UserError("each context-parallel chunk holds " + std::to_string(c.chunk_len) +
                      " tokens, fewer than the gated DeltaNet convolution's " + std::to_string(d.conv - 1) +
                      " history tokens; use a longer sequence or a smaller cp");

  ParamStore ps(tr, pg, model_units(m, d, pg.ep.rank, pg.ep.size), p.optimizer_sharding, o.seed);
  const std::vector<UnitLayout>& units = ps.units();
  const int n = int(m.layers.size());
  const int emb = 0, fn = n + 1, head = d.tied ? 0 : n + 2;
  const bool fsdp = p.optimizer_sharding == OptimizerSharding::Fsdp;
  // Forward + loss order, then backward (-1: no weights needed, the embedding's backward scatters rows).
  std::vector<int> order;
  order.push_back(emb);
  for (int l = 0; l < n; ++l) order.push_back(1 + l);
  order.push_back(fn);
  order.push_back(head);
  for (int l = n - 1; l >= 0; --l) order.push_back(1 + l);
  const size_t i_fn = size_t(n) + 1, i_head = size_t(n) + 2;
  auto i_bwd = [&](int l) { return size_t(n) + 3 + size_t(n - 1 - l); };

  const int M = std::max(1, num_microbatches(p));
  const int dp = pg.dp.size, dp_rank = pg.dp.rank;
  const double global_tokens = double(effective_global_batch(p)) * double(p.seq_len);

  ExecResult res;
  res.microbatches = M;
  res.setup_seconds = since(t_setup);
  RankReport rep;
  rep.rank = world.rank;
  auto hook = [&](Phase ph, int step, int mbatch) {
    if (world.rank == o.fail_rank && step == 1 && mbatch == 0 && o.fail_phase == to_string(ph))
      throw std::runtime_error(std::string("injected failure at the start of the ") + to_string(ph) +
                               " phase (test hook LCPLAN_EXEC_FAIL=" + std::to_string(o.fail_rank) + ":" +
                               o.fail_phase + ")");
  };

  const double cpu0 = cpu_now();
  for (int step = 1; step <= o.steps; ++step) {
    const auto t_step = Clock::now();
    ps.zero_grads();
    double loss_sum = 0;
    Fsdp fs{ps, {}, {-1, -1}, {}, {}};
    if (fsdp) {
      for (auto& s : fs.slot) s = Buf<bf16>(tr, Category::FsdpBuffers, ps.buffer_elems());
    }
    for (int mbatch = 0; mbatch < M; ++mbatch) {
      // ---- forward
      auto t0 = Clock::now();
      tr.set_phase(Phase::Forward);
      hook(Phase::Forward, step, mbatch);
      Buf<int64_t> tokens(tr, Category::Workspace, size_t(c.tokens)), targets(tr, Category::Workspace, size_t(c.tokens));
      for (int j = 0; j < c.mb; ++j) {
        const int64_t sample = (int64_t(mbatch) * dp + dp_rank) * c.mb + j;
        for (int64_t r = 0; r < c.seq_local; ++r) {
          const int64_t pos = c.chunk_start(int(r / c.chunk_len)) + r % c.chunk_len;
          tokens[size_t(j * c.seq_local + r)] = data_token(o.seed, sample, pos, d.V);
          targets[size_t(j * c.seq_local + r)] = data_token(o.seed, sample, pos + 1, d.V);
        }
      }
      std::vector<LayerSaved> saved(n);
      {
        const UnitView ew = fsdp ? fs.at(order, 0, true) : ps.view(emb);
        saved[0].x = Buf<bf16>(tr, Category::Activations, size_t(c.tokens * d.H));
        for (int64_t t = 0; t < c.tokens; ++t)
          std::copy(ew.dense + tokens[size_t(t)] * d.H, ew.dense + (tokens[size_t(t)] + 1) * d.H,
                    saved[0].x.data() + t * d.H);
      }
      Buf<float> xL;
      for (int l = 0; l < n; ++l) {
        const UnitView w = fsdp ? fs.at(order, size_t(1 + l), true) : ps.view(1 + l);
        Buf<float> out(tr, Category::Workspace, size_t(c.tokens * d.H));
        layer_forward(c, units[1 + l], w, m.layers[l], keep_of(p, l), saved[l], out.data());
        if (l + 1 < n) {
          saved[l + 1].x = Buf<bf16>(tr, Category::Activations, out.size());
          to_bf16(out.data(), saved[l + 1].x.data(), out.size());
        } else {
          xL = std::move(out);
        }
      }
      rep.phase_seconds[0] += since(t0);
      // ---- loss (forward and backward of the final norm, LM head and cross-entropy)
      t0 = Clock::now();
      tr.set_phase(Phase::Loss);
      hook(Phase::Loss, step, mbatch);
      Buf<float> dx(tr, Category::Workspace, size_t(c.tokens * d.H));
      if (fsdp) {
        const UnitView fw = fs.at(order, i_fn, true);
        const UnitView hw = fs.at(order, i_head, false);  // final norm still in use: nothing prefetched over it
        // The LM head's and final norm's gradients are reduce-scattered straight from the loss's own fp32 buffers
        // (workspace), so the unit-gradient buffer first exists in the backward phase, as the estimator has it.
        Buf<float> hg(tr, Category::Workspace, ps.unit_buffer_elems(head));
        Buf<float> fg(tr, Category::Workspace, ps.unit_buffer_elems(fn));
        loss_sum += loss_forward_backward(c, fw.dense, hw.dense, fg.data(), hg.data(), xL.data(), targets.data(),
                                          1.0 / global_tokens, dx.data());
        ps.reduce_into_shard(head, hg.data());
        ps.reduce_into_shard(fn, fg.data());
      } else {
        loss_sum += loss_forward_backward(c, ps.view(fn).dense, ps.view(head).dense, ps.grad(fn).dense,
                                          ps.grad(head).dense, xL.data(), targets.data(), 1.0 / global_tokens,
                                          dx.data());
      }
      xL.reset();
      rep.phase_seconds[1] += since(t0);
      // ---- backward
      t0 = Clock::now();
      tr.set_phase(Phase::Backward);
      hook(Phase::Backward, step, mbatch);
      if (fsdp) fs.grad = Buf<float>(tr, Category::FsdpBuffers, ps.buffer_elems());
      for (int l = n - 1; l >= 0; --l) {
        Buf<float> dprev(tr, Category::Workspace, size_t(c.tokens * d.H));
        if (fsdp) {
          const UnitView w = fs.at(order, i_bwd(l), l > 0);
          const UnitGrad g = ps.buffer_grad(1 + l, fs.grad.data());
          layer_backward(c, units[1 + l], w, g, m.layers[l], keep_of(p, l), saved[l], dx.data(), dprev.data());
          ps.reduce_into_shard(1 + l, fs.grad.data());
        } else {
          layer_backward(c, units[1 + l], ps.view(1 + l), ps.grad(1 + l), m.layers[l], keep_of(p, l), saved[l],
                         dx.data(), dprev.data());
        }
        dx = std::move(dprev);
      }
      {  // embedding: scatter-add the rows' gradients
        const UnitGrad g = fsdp ? ps.buffer_grad(emb, fs.grad.data()) : ps.grad(emb);
        for (int64_t t = 0; t < c.tokens; ++t)
          for (int64_t h = 0; h < d.H; ++h) g.dense[tokens[size_t(t)] * d.H + h] += dx[size_t(t * d.H + h)];
        if (fsdp) ps.reduce_into_shard(emb, fs.grad.data());
      }
      if (fsdp) fs.grad.reset();
      rep.phase_seconds[2] += since(t0);
    }
    for (auto& s : fs.slot) s.reset();
    // ---- optimizer
    auto t0 = Clock::now();
    tr.set_phase(Phase::Optimizer);
    hook(Phase::Optimizer, step, 0);
    ps.sync_grads();
    double sums[2] = {loss_sum, ps.grad_sq_owned()};
    comm::all_reduce(world, sums, 2, comm::DType::F64, comm::ReduceOp::Sum);
    ps.adam_step(step, o.adam);
    tr.clear_phase();
    rep.phase_seconds[3] += since(t0);
    res.loss.push_back(sums[0] / global_tokens);
    res.grad_norm.push_back(std::sqrt(sums[1]));
    res.step_seconds.push_back(since(t_step));
  }
  for (int ph = 0; ph < kPhases; ++ph) rep.phases[ph] = tr.peak(Phase(ph));
  rep.workspace_high_water = tr.workspace_high_water();
  rep.moe_rows_received = c.moe_rows_received;
  rep.moe_rows_sent = c.moe_rows_sent;
  rep.tracker_ops = double(tr.operations());
  rep.cpu_seconds = cpu_now() - cpu0;
  // Every rank's report to every rank (the step time is the slowest rank's).
  const std::vector<double> mine = pack(rep);
  std::vector<double> all(size_t(kReportDoubles) * world.size);
  comm::all_gather(world, mine.data(), all.data(), kReportDoubles, comm::DType::F64);
  for (int r = 0; r < world.size; ++r) res.ranks.push_back(unpack(all.data() + size_t(r) * kReportDoubles));
  comm::all_reduce(world, res.step_seconds.data(), res.step_seconds.size(), comm::DType::F64, comm::ReduceOp::Max);
  return res;
}

}  // namespace lcplan::exec
