// The step's pieces that need no backend (step_impl.h): clocks, the recompute rule per layer, the refusals, the
// layers' context, this stage's units and their order, and the report's all-gather payload.
#include <chrono>
#include <ctime>

#include "executor/step_impl.h"

namespace lcplan::exec::step_detail {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double cpu_now() { return double(std::clock()) / CLOCKS_PER_SEC; }  // this process's CPU time
double thread_cpu_now() {  // this thread's CPU time (MPI's helper threads excluded)
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

Keep keep_of(const Plan& p, int pos) {
  switch (p.recompute) {
    case Recompute::None: return Keep::All;
    case Recompute::Selective: return Keep::Selective;
    case Recompute::Full:  // Megatron's block method: the first recompute_layers layers (0 = all) of each virtual stage
      return p.recompute_layers == 0 || pos < p.recompute_layers ? Keep::InputOnly : Keep::All;
  }
  return Keep::All;
}

void check_run(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o) {
  if (const std::string e = executor_support_error(m, p); !e.empty()) throw UserError(e);
  require_valid_plan(m, p);
  if (p.gpus != world.size)
    throw UserError("the plan is for gpus = " + std::to_string(p.gpus) + " ranks but the job has " +
                    std::to_string(world.size) + "; launch lcplan-exec with mpirun -np " + std::to_string(p.gpus));
  if (o.steps < 1) throw UserError("--steps " + std::to_string(o.steps) + " must be at least 1");
}

Ctx make_ctx(Tracker& tr, const Dims& d, const comm::ProcessGroups& pg, const ModelSpec& m, const Plan& p,
             const ExecOptions& o) {
  const Parallel& q = p.parallel;
  Ctx c{tr, d, pg};
  c.seq = p.seq_len;
  c.mb = p.micro_batch;
  c.cp = q.cp;
  c.cp_rank = pg.cp.rank;
  c.seq_local = p.seq_len / q.cp;
  c.chunks = q.cp > 1 ? 2 : 1;
  c.chunk_len = c.seq_local / c.chunks;
  c.tokens = int64_t(c.mb) * c.seq_local;
  c.segments = p.packed_lengths;  // plan rules: micro_batch 1, summing to seq_len, each a multiple of 2 cp tp
  c.tp = q.tp;
  c.tp_rank = pg.tp.rank;
  c.rows = c.tokens / q.tp;  // sequence parallelism: this TP rank's consecutive token rows
  c.rope_theta = o.rope_theta;
  c.linear_ce = p.linear_ce;
  c.ce_vocab_tile = o.ce_vocab_tile;
  const auto moe = [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; };
  if (std::any_of(m.layers.begin(), m.layers.end(), moe))
    c.sched = moe::make_chunk_schedule(std::max(1, p.moe.ep_chunks), {}, d.moe.shared_ffn > 0);
  // The shortest chunk: a whole sequence's, or a packed microbatch's shortest segment's (each split over CP alone).
  int64_t chunk = c.chunk_len;
  for (int64_t len : c.segments) chunk = std::min(chunk, len / q.cp / c.chunks);
  for (const LayerSpec& l : m.layers)
    if (l.mixer == MixerKind::LinearAttention && c.cp > 1 && chunk < d.conv - 1)
      throw UserError("a context-parallel chunk holds " + std::to_string(chunk) +
                      " tokens, fewer than the gated DeltaNet convolution's " + std::to_string(d.conv - 1) +
                      " history tokens; use longer sequences or a smaller cp");
  return c;
}

StageUnits stage_units(const ModelSpec& m, const Plan& p, const Dims& d, const comm::ProcessGroups& pg) {
  const Parallel& q = p.parallel;
  const int n = int(m.layers.size()), pp = q.pp, stage = pg.pp.rank;
  // The estimator's own split (parallel/pipeline_split.h); a tied embedding gets a copy on the last stage (pp > 1).
  const SplitResult split = split_layers(n, pp, q.vpp, p.pipeline);
  if (!split.ok) throw UserError(split.error);
  const std::vector<UnitLayout> all = model_units(m, d, {pg.ep.rank, q.ep, pg.etp.rank, q.etp});
  StageUnits su;
  su.places = place_layers(split.split);
  su.unit_of_layer.assign(size_t(n), -1);
  su.chunk_layers.resize(size_t(q.vpp));
  auto add = [&su](const UnitLayout& u) {
    su.mine.push_back(u);
    return int(su.mine.size()) - 1;
  };
  if (stage == 0) su.emb = add(all[0]);
  for (int l = 0; l < n; ++l)
    if (su.places[size_t(l)].stage == stage) {
      su.unit_of_layer[size_t(l)] = add(all[size_t(1 + l)]);
      su.chunk_layers[size_t(su.places[size_t(l)].vchunk)].push_back(l);
    }
  if (stage == pp - 1) {
    su.fn = add(all[size_t(n + 1)]);
    if (!d.tied) su.head = add(all[size_t(n + 2)]);
    else su.head = pp == 1 ? su.emb : add(tied_head_copy(all[0]));
  }
  return su;
}

std::vector<int> unit_order(const std::vector<PipeAction>& actions, const StageUnits& su, int pp, int stage) {
  const int chunks_total = pp * int(su.chunk_layers.size());
  std::vector<int> order;
  for (const PipeAction& a : actions) {
    const std::vector<int>& ls = su.chunk_layers[size_t(a.chunk)];
    const int v = a.chunk * pp + stage;
    if (a.forward) {
      if (v == 0) order.push_back(su.emb);
      for (int l : ls) order.push_back(su.unit_of_layer[size_t(l)]);
      if (v == chunks_total - 1) {
        order.push_back(su.fn);
        order.push_back(su.head);
      }
    } else {
      for (auto it = ls.rbegin(); it != ls.rend(); ++it) order.push_back(su.unit_of_layer[size_t(*it)]);
    }
  }
  return order;
}

std::vector<double> pack(const RankReport& r) {
  std::vector<double> v;
  v.push_back(r.rank);
  v.push_back(r.stage);
  for (const PhasePeak& p : r.phases) {
    v.push_back(p.seen ? 1 : 0);
    for (double b : p.at_peak.bytes) v.push_back(b);
    for (double b : p.category_max.bytes) v.push_back(b);
  }
  v.push_back(r.workspace_high_water);
  for (double s : r.phase_seconds) v.push_back(s);
  v.push_back(r.moe_rows_received);
  v.push_back(r.moe_rows_sent);
  v.push_back(r.attention_pairs);
  v.push_back(r.tracker_ops);
  v.push_back(r.cpu_seconds);
  return v;
}

RankReport unpack(const double* v) {
  RankReport r;
  size_t i = 0;
  r.rank = int(v[i++]);
  r.stage = int(v[i++]);
  for (PhasePeak& p : r.phases) {
    p.seen = v[i++] != 0;
    for (double& b : p.at_peak.bytes) b = v[i++];
    for (double& b : p.category_max.bytes) b = v[i++];
  }
  r.workspace_high_water = v[i++];
  for (double& s : r.phase_seconds) s = v[i++];
  r.moe_rows_received = v[i++];
  r.moe_rows_sent = v[i++];
  r.attention_pairs = v[i++];
  r.tracker_ops = v[i++];
  r.cpu_seconds = v[i++];
  return r;
}

}  // namespace lcplan::exec::step_detail
