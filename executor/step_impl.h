// lcplan-exec's training step, once for both backends (executor/README.md): the step below is the CPU backend's
// (executor.cpp, HostBackend) and the GPU backend's (executor_cuda.cpp, DeviceBackend). A Backend offers
//   template <class T> using Buf; using Ops; using Store;     buffers, layer ops (layers/common.h), parameter store
//   groups(world, layout)  the process groups (MPI, or NCCL on the step's stream)
//   mem()                  the store's memory policy; ops(tracker): the layers' Ops
//   ids(tracker, vector)   token ids or targets where the layers read them (charged as workspace)
//   attach(tracker)        lets the backend's buffers of this tracker follow its stream (the device allocates in order)
//   pipe_links(pp)         the links between pipeline stages (comm::make_pipe_links, on the backend's streams)
//   before_send()          the outgoing links may read what the rank's work so far wrote (the device orders streams)
//   after_recv()           a received message is in place before the host goes on (the bubble is timed)
//   phase_begin(phase)     marks a phase's start on the device (CUDA events; nothing on CPUs)
//   phase_end(tracker, phase) waits for the device's queued work (a phase's end is read after it), checks its memory
//   device_phase_seconds() the device's own time per phase so far (CUDA events), zeros on CPUs
//   name(), device()       the backend ("cpu", "cuda") and what it ran on, for the record
//   notes()                remarks for the record
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <vector>

#include "common/user_error.h"
#include "estimator/plan_rules.h"
#include "executor/exec_model.h"
#include "executor/executor.h"
#include "executor/layers/decoder_layer.h"
#include "executor/layers/embedding.h"
#include "executor/layers/loss.h"
#include "executor/scale.h"
#include "executor/schedule.h"
#include "kernels/comm/groups.h"
#include "parallel/pipeline_split.h"

namespace lcplan::exec::step_detail {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t);  // seconds since t
double cpu_now();                   // this process's CPU time
double thread_cpu_now();            // this thread's CPU time (MPI's helper threads excluded)
// What a layer keeps under the plan's recompute; `pos`: the layer's position in its virtual stage.
Keep keep_of(const Plan& p, int pos);
// A rank's report as doubles (the all-gather's payload), and back.
constexpr int kReportDoubles = 2 + kPhases * (1 + 2 * kCategories) + 1 + kPhases + 4;
std::vector<double> pack(const RankReport& r);
RankReport unpack(const double* v);

template <class Backend>
struct Step {
  template <class T>
  using Buf = typename Backend::template Buf<T>;
  using Ops = typename Backend::Ops;
  using Store = typename Backend::Store;
  using Saved = BasicLayerSaved<Backend::template Buf>;

  // FSDP's two gather buffers (the current unit and the prefetched next one) and the unsharded gradient of one unit,
  // each sized to the largest unit (Megatron-FSDP's double buffer): the estimator's fsdp_buffers.
  struct Fsdp {
    Store& ps;
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

  static ExecResult run(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o, Backend& be) {
    const auto t_setup = Clock::now();
    if (const std::string e = executor_support_error(m, p); !e.empty()) throw UserError(e);
    require_valid_plan(m, p);
    if (p.gpus != world.size)
      throw UserError("the plan is for gpus = " + std::to_string(p.gpus) + " ranks but the job has " +
                      std::to_string(world.size) + "; launch lcplan-exec with mpirun -np " + std::to_string(p.gpus));
    if (o.steps < 1) throw UserError("--steps " + std::to_string(o.steps) + " must be at least 1");
    const Parallel& q = p.parallel;
    const RankLayout layout = make_rank_layout(p.gpus, q.tp, q.pp, q.cp, q.ep, q.etp);
    comm::ProcessGroups pg = be.groups(world, layout);
    comm::PipeLinks links;
    struct FreeGroups {
      comm::ProcessGroups& g;
      comm::PipeLinks& l;
      ~FreeGroups() {
        try {
          comm::free_pipe_links(l);
          comm::free_groups(g);
        } catch (...) {
        }
      }
    } free_groups_at_exit{pg, links};
    links = be.pipe_links(pg.pp);

    Tracker tr(o.workspace_reserve);
    be.attach(tr);
    const int pp = q.pp, vpp = q.vpp, stage = pg.pp.rank, chunks_total = pp * vpp;
    const Dims d = make_dims(m, q.tp, pg.tp.rank, q.etp, pg.etp.rank);
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
    c.tp = q.tp;
    c.tp_rank = pg.tp.rank;
    c.rows = c.tokens / q.tp;  // sequence parallelism: this TP rank's consecutive token rows
    c.rope_theta = o.rope_theta;
    c.linear_ce = p.linear_ce;
    c.ce_vocab_tile = o.ce_vocab_tile;
    if (has_moe) c.sched = moe::make_chunk_schedule(std::max(1, p.moe.ep_chunks), {}, d.moe.shared_ffn > 0);
    for (const LayerSpec& l : m.layers)
      if (l.mixer == MixerKind::LinearAttention && c.cp > 1 && c.chunk_len < d.conv - 1)
        throw UserError("each context-parallel chunk holds " + std::to_string(c.chunk_len) +
                        " tokens, fewer than the gated DeltaNet convolution's " + std::to_string(d.conv - 1) +
                        " history tokens; use a longer sequence or a smaller cp");

    // This stage's units: the embedding on stage 0, its decoder layers as the plan's split places them (the
    // estimator's own code, parallel/pipeline_split.h), final norm and LM head on the last stage (Megatron's placement;
    // a tied embedding gets a copy there when pp > 1).
    const int n = int(m.layers.size());
    const SplitResult split = split_layers(n, pp, vpp, p.pipeline);
    if (!split.ok) throw UserError(split.error);
    const std::vector<LayerPlace> places = place_layers(split.split);
    const std::vector<UnitLayout> all = model_units(m, d, {pg.ep.rank, q.ep, pg.etp.rank, q.etp});
    std::vector<UnitLayout> mine;
    std::vector<int> unit_of_layer(n, -1);
    std::vector<std::vector<int>> chunk_layers(vpp);  // decoder layers of each virtual chunk on this stage, in order
    int emb = -1, fn = -1, head = -1;
    if (stage == 0) {
      emb = int(mine.size());
      mine.push_back(all[0]);
    }
    for (int l = 0; l < n; ++l)
      if (places[l].stage == stage) {
        unit_of_layer[l] = int(mine.size());
        mine.push_back(all[1 + l]);
        chunk_layers[places[l].vchunk].push_back(l);
      }
    if (stage == pp - 1) {
      fn = int(mine.size());
      mine.push_back(all[n + 1]);
      if (!d.tied) {
        head = int(mine.size());
        mine.push_back(all[n + 2]);
      } else if (pp == 1) {
        head = emb;
      } else {
        head = int(mine.size());
        mine.push_back(tied_head_copy(all[0]));
      }
    }
    Store ps(tr, pg, mine, p.optimizer_sharding, o.seed, be.mem());
    Ops ops = be.ops(tr);
    const std::vector<UnitLayout>& units = ps.units();
    const bool fsdp = p.optimizer_sharding == OptimizerSharding::Fsdp;

    const int M = std::max(1, num_microbatches(p));
    const std::vector<PipeAction> actions = pipeline_schedule(pp, vpp, stage, M);
    const auto vstage = [&](int chunk) { return chunk * pp + stage; };
    const bool first_v_here = stage == 0, last_v_here = stage == pp - 1;
    // Units in the order the step uses them (FSDP gathers them in this order, prefetching the next; -1: none).
    std::vector<int> order;
    std::vector<char> no_prefetch;  // the LM head: the final norm's buffer is still in use
    for (const PipeAction& a : actions) {
      const std::vector<int>& ls = chunk_layers[a.chunk];
      if (a.forward) {
        if (vstage(a.chunk) == 0) order.push_back(emb);
        for (int l : ls) order.push_back(unit_of_layer[l]);
        if (vstage(a.chunk) == chunks_total - 1) {
          order.push_back(fn);
          order.push_back(head);
        }
      } else {
        for (auto it = ls.rbegin(); it != ls.rend(); ++it) order.push_back(unit_of_layer[*it]);
      }
    }
    const int dp = pg.dp.size, dp_rank = pg.dp.rank;
    const double global_tokens = double(effective_global_batch(p)) * double(p.seq_len);
    const int64_t R = c.rows, H = d.H;

    ExecResult res;
    res.microbatches = M;
    res.setup_seconds = since(t_setup);
    RankReport rep;
    rep.rank = world.rank;
    rep.stage = stage;
    // Phase segments on the host clock: one reading at each boundary is both the phase's time and its trace mark.
    std::vector<PhaseSegment> segments;
    PhaseMark open;
    Clock::time_point origin;
    auto begin_phase = [&](Phase ph, int step, int mbatch, int vst) {
      tr.set_phase(ph);
      be.phase_begin(ph);
      open = PhaseMark{ph, true, step, mbatch, vst, since(origin)};
      if (o.on_phase) o.on_phase(open);
    };
    auto end_phase = [&]() {
      be.phase_end(tr, open.phase);  // the device's work of the phase is done before its end is read off the host clock
      PhaseMark m = open;
      m.begin = false;
      m.seconds = since(origin);
      segments.push_back(PhaseSegment{m.phase, m.step, m.microbatch, m.vstage, open.seconds, m.seconds});
      if (o.on_phase) o.on_phase(m);
    };
    // Point-to-point messages between pipeline stages (Megatron p2p_communication): a virtual stage's output
    // activations (bf16, this rank's sequence-parallel rows) to the next, input gradients (fp32) to the previous, each
    // direction on its own link. One tag for all: a link's messages match in the order they were sent, on MPI as on
    // NCCL (which has no tags), so the CPU tests run the order the GPU relies on (schedule.h
    // pipeline_message_order_error proves it for every schedule).
    constexpr int kPipeTag = 0;
    // A receive inside the open phase, kept as a wait segment (the bubble this rank sits through).
    auto pp_recv = [&](bool forward, void* buf, size_t count, comm::DType t) {
      const double t0 = since(origin);
      const comm::Comm& in = forward ? links.fwd_in : links.bwd_in;
      comm::recv(in, buf, count, t, comm::link_peer(in), kPipeTag);
      be.after_recv();
      segments.push_back(PhaseSegment{open.phase, open.step, open.microbatch, open.vstage, t0, since(origin), true});
    };
    auto pp_send = [&](bool forward, const void* buf, size_t count, comm::DType t) {
      be.before_send();
      const comm::Comm& out = forward ? links.fwd_out : links.bwd_out;
      return comm::isend(out, buf, count, t, comm::link_peer(out), kPipeTag);
    };
    // Token ids and targets of every local token of microbatch `mb` (sample (mb dp + d) micro_batch + j).
    auto data = [&](int mbatch, Buf<int64_t>& tokens, Buf<int64_t>& targets) {
      std::vector<int64_t> tok(size_t(c.tokens)), tgt(size_t(c.tokens));
      for (int j = 0; j < c.mb; ++j) {
        const int64_t sample = (int64_t(mbatch) * dp + dp_rank) * c.mb + j;
        for (int64_t r = 0; r < c.seq_local; ++r) {
          const int64_t pos = c.chunk_start(int(r / c.chunk_len)) + r % c.chunk_len;
          tok[size_t(j * c.seq_local + r)] = data_token(o.seed, sample, pos, d.V);
          tgt[size_t(j * c.seq_local + r)] = data_token(o.seed, sample, pos + 1, d.V);
        }
      }
      tokens = be.ids(tr, tok);
      targets = be.ids(tr, tgt);
    };
    struct Pending {
      comm::Request req;
      Buf<bf16> act;
      Buf<float> grad;
    };
    std::vector<Pending> sends;
    auto reap = [&](bool all_of_them) {  // completed sends release their buffers
      for (size_t i = 0; i < sends.size();) {
        if (all_of_them) comm::wait(sends[i].req);
        if (all_of_them || comm::test(sends[i].req)) {
          sends.erase(sends.begin() + long(i));
        } else {
          ++i;
        }
      }
    };

    comm::barrier(world);  // the phase trace's common origin
    origin = Clock::now();
    const double cpu0 = cpu_now();
    std::array<double, kPhases> device_before = be.device_phase_seconds();
    for (int step = 1; step <= o.steps; ++step) {
      const auto t_step = Clock::now();
      const double cpu_step = thread_cpu_now();
      ps.zero_grads();
      double loss_sum = 0;
      Fsdp fs{ps, {}, {-1, -1}, {}, {}};
      if (fsdp) {
        for (auto& s : fs.slot) s = Buf<bf16>(tr, Category::FsdpBuffers, ps.buffer_elems());
      }
      size_t fi = 0;  // cursor in `order`
      auto unit = [&](int u, bool prefetch) -> UnitView {
        if (!fsdp) {
          ++fi;
          return ps.view(u);
        }
        const UnitView v = fs.at(order, fi, prefetch);
        ++fi;
        return v;
      };
      // Saved tensors per (microbatch, chunk), and the loss's gradient waiting for the last chunk's backward.
      std::vector<std::vector<std::vector<Saved>>> saved(M);
      for (auto& per_chunk : saved) per_chunk.resize(vpp);
      std::vector<Buf<float>> loss_grad(M);
      for (const PipeAction& a : actions) {
        const int v = vstage(a.chunk), mbatch = a.microbatch;
        const std::vector<int>& ls = chunk_layers[a.chunk];
        if (a.forward) {
          // ---- forward of this virtual stage (and, on the last, the loss)
          begin_phase(Phase::Forward, step, mbatch, v);
          std::vector<Saved>& sv = saved[mbatch][a.chunk];
          sv.resize(std::max<size_t>(1, ls.size()));
          sv[0].x = Buf<bf16>(tr, Category::Activations, size_t(R * H));
          if (v == 0) {
            Buf<int64_t> tokens, targets;
            data(mbatch, tokens, targets);
            const UnitView ew = unit(emb, true);
            impl::embedding_forward(ops, c, ew.dense, tokens.data(), sv[0].x.data());
          } else {
            pp_recv(true, sv[0].x.data(), sv[0].x.size(), comm::DType::BF16);
          }
          Buf<float> out;
          if (ls.empty()) {  // a virtual stage without decoder layers passes its input on
            out = ops.widen(sv[0].x.data(), sv[0].x.size());
          }
          for (size_t k = 0; k < ls.size(); ++k) {
            const int l = ls[k];
            const UnitView w = unit(unit_of_layer[l], true);
            out = Buf<float>(tr, Category::Workspace, size_t(R * H));
            impl::layer_forward(ops, c, units[unit_of_layer[l]], w, m.layers[l], keep_of(p, places[l].pos), sv[k], out.data());
            if (k + 1 < ls.size()) {
              sv[k + 1].x = Buf<bf16>(tr, Category::Activations, out.size());
              ops.to_bf16(out.data(), sv[k + 1].x.data(), out.size());
            }
          }
          if (ls.empty()) sv.clear();
          end_phase();
          if (v == chunks_total - 1) {
            // ---- loss (forward and backward of the final norm, LM head and cross-entropy)
            begin_phase(Phase::Loss, step, mbatch, -1);
            Buf<int64_t> tokens, targets;
            data(mbatch, tokens, targets);
            tokens.reset();
            Buf<float> dx(tr, Category::Workspace, size_t(R * H));
            double l = 0;
            if (fsdp) {
              const UnitView fw = unit(fn, true);
              const UnitView hw = unit(head, false);  // final norm still in use: nothing prefetched over it
              // The LM head's and final norm's gradients are reduce-scattered straight from the loss's own fp32
              // buffers (workspace), so the unit-gradient buffer first exists in the backward phase, as the estimator
              // has it.
              Buf<float> hg(tr, Category::Workspace, ps.unit_buffer_elems(head));
              Buf<float> fg(tr, Category::Workspace, ps.unit_buffer_elems(fn));
              l = impl::loss_forward_backward(ops, c, fw.dense, hw.dense, fg.data(), hg.data(), out.data(), targets.data(),
                                        1.0 / global_tokens, dx.data());
              ps.reduce_into_shard(head, hg.data());
              ps.reduce_into_shard(fn, fg.data());
            } else {
              unit(fn, false);
              unit(head, false);
              l = impl::loss_forward_backward(ops, c, ps.view(fn).dense, ps.view(head).dense, ps.grad(fn).dense,
                                        ps.grad(head).dense, out.data(), targets.data(), 1.0 / global_tokens, dx.data());
            }
            if (pg.tp.rank == 0) loss_sum += l;  // every TP rank computed the whole loss
            loss_grad[mbatch] = std::move(dx);
            end_phase();
          } else {
            Pending s;
            s.act = Buf<bf16>(tr, Category::Workspace, out.size());
            ops.to_bf16(out.data(), s.act.data(), out.size());
            s.req = pp_send(true, s.act.data(), s.act.size(), comm::DType::BF16);
            sends.push_back(std::move(s));
          }
        } else {
          // ---- backward of this virtual stage
          begin_phase(Phase::Backward, step, mbatch, v);
          if (fsdp) fs.grad = Buf<float>(tr, Category::FsdpBuffers, ps.buffer_elems());
          Buf<float> dx;
          if (v == chunks_total - 1) {
            dx = std::move(loss_grad[mbatch]);
          } else {
            dx = Buf<float>(tr, Category::Workspace, size_t(R * H));
            pp_recv(false, dx.data(), dx.size(), comm::DType::F32);
          }
          std::vector<Saved>& sv = saved[mbatch][a.chunk];
          for (int k = int(ls.size()) - 1; k >= 0; --k) {
            const int l = ls[size_t(k)], u = unit_of_layer[l];
            Buf<float> dprev(tr, Category::Workspace, size_t(R * H));
            const UnitView w = unit(u, true);
            if (fsdp) {
              const UnitGrad g = ps.buffer_grad(u, fs.grad.data());
              impl::layer_backward(ops, c, units[u], w, g, m.layers[l], keep_of(p, places[l].pos), sv[size_t(k)], dx.data(),
                             dprev.data());
              ps.reduce_into_shard(u, fs.grad.data());
            } else {
              impl::layer_backward(ops, c, units[u], w, ps.grad(u), m.layers[l], keep_of(p, places[l].pos), sv[size_t(k)],
                             dx.data(), dprev.data());
            }
            dx = std::move(dprev);
          }
          sv.clear();
          if (v == 0) {  // embedding: scatter-add the rows' gradients
            Buf<int64_t> tokens, targets;
            data(mbatch, tokens, targets);
            const UnitGrad g = fsdp ? ps.buffer_grad(emb, fs.grad.data()) : ps.grad(emb);
            impl::embedding_backward(ops, c, tokens.data(), dx.data(), g.dense);
            if (fsdp) ps.reduce_into_shard(emb, fs.grad.data());
          } else {
            Pending s;
            s.grad = std::move(dx);
            s.req = pp_send(false, s.grad.data(), s.grad.size(), comm::DType::F32);
            sends.push_back(std::move(s));
          }
          if (fsdp) fs.grad.reset();
          end_phase();
        }
        reap(false);
      }
      reap(true);
      for (auto& s : fs.slot) s.reset();
      // ---- optimizer
      begin_phase(Phase::Optimizer, step, -1, -1);
      if (d.tied && pp > 1 && (first_v_here || last_v_here)) {
        // The tied embedding's two copies (first stage: embedding, last stage: LM head) get the sum of both
        // gradients (Megatron's embedding group all-reduce).
        const int u = first_v_here ? emb : head, peer = first_v_here ? pp - 1 : 0;
        const size_t len = ps.dense_grad_size(u);
        Buf<float> other(tr, Category::Workspace, len);
        comm::sendrecv(pg.pp, ps.dense_grad_array(u), other.data(), len, comm::DType::F32, peer, 17000);
        ops.accumulate(other.data(), ps.dense_grad_array(u), len);  // a + b == b + a: both copies stay identical
      }
      ps.sync_grads();
      double sums[2] = {loss_sum, ps.grad_sq_owned()};
      // The step's one all-rank collective: a stage that finished its pipeline work early (the drain) waits here.
      const double t_sums = since(origin);
      comm::all_reduce(world, sums, 2, comm::DType::F64, comm::ReduceOp::Sum);
      segments.push_back(PhaseSegment{Phase::Optimizer, step, -1, -1, t_sums, since(origin), true});
      ps.adam_step(step, o.adam);
      end_phase();
      tr.clear_phase();
      res.loss.push_back(sums[0] / global_tokens);
      res.grad_norm.push_back(std::sqrt(sums[1]));
      res.step_seconds.push_back(since(t_step));
      const std::array<double, kPhases> this_step = phase_totals(segments, step);
      for (int ph = 0; ph < kPhases; ++ph) rep.phase_seconds[size_t(ph)] += this_step[size_t(ph)];
      res.step_phase_seconds.push_back(this_step);
      const std::array<double, kPhases> device_now = be.device_phase_seconds();
      std::array<double, kPhases> device_step{};
      for (int ph = 0; ph < kPhases; ++ph) device_step[size_t(ph)] = device_now[size_t(ph)] - device_before[size_t(ph)];
      res.step_device_phase_seconds.push_back(device_step);
      device_before = device_now;
      res.step_cpu_seconds.push_back(thread_cpu_now() - cpu_step);
      res.step_pipeline_wait_seconds.push_back(pipeline_wait_seconds(segments, step));
      if (!o.gather_segments) segments.clear();  // bounded by one step's segments
    }
    for (int ph = 0; ph < kPhases; ++ph) rep.phases[ph] = tr.peak(Phase(ph));
    res.notes = be.notes();
    res.backend = be.name();
    res.device = be.device();
    rep.workspace_high_water = tr.workspace_high_water();
    rep.moe_rows_received = c.moe_rows_received;
    rep.moe_rows_sent = c.moe_rows_sent;
    rep.tracker_ops = double(tr.operations());
    rep.cpu_seconds = cpu_now() - cpu0;
    // Every rank's report to every rank (the step time is the slowest rank's).
    const std::vector<double> mine_report = pack(rep);
    std::vector<double> all_reports(size_t(kReportDoubles) * world.size);
    comm::all_gather(world, mine_report.data(), all_reports.data(), kReportDoubles, comm::DType::F64);
    for (int r = 0; r < world.size; ++r) res.ranks.push_back(unpack(all_reports.data() + size_t(r) * kReportDoubles));
    if (o.gather_segments) {  // every rank's phase segments (stages hold different counts: padded to the longest)
      double count = double(segments.size());
      std::vector<double> counts(size_t(world.size));
      comm::all_gather(world, &count, counts.data(), 1, comm::DType::F64);
      size_t most = 0;
      for (double n : counts) most = std::max(most, size_t(n));
      std::vector<double> mine_segments(most * kSegmentDoubles), all_segments(mine_segments.size() * size_t(world.size));
      for (size_t i = 0; i < segments.size(); ++i) pack_segment(segments[i], mine_segments.data() + i * kSegmentDoubles);
      if (most > 0)
        comm::all_gather(world, mine_segments.data(), all_segments.data(), mine_segments.size(), comm::DType::F64);
      res.segments.resize(size_t(world.size));
      for (int r = 0; r < world.size; ++r)
        for (size_t i = 0; i < size_t(counts[size_t(r)]); ++i)
          res.segments[size_t(r)].push_back(
              unpack_segment(all_segments.data() + (size_t(r) * most + i) * kSegmentDoubles));
    }
    comm::all_reduce(world, res.step_pipeline_wait_seconds.data(), res.step_pipeline_wait_seconds.size(),
                     comm::DType::F64, comm::ReduceOp::Min);
    comm::all_reduce(world, res.step_seconds.data(), res.step_seconds.size(), comm::DType::F64, comm::ReduceOp::Max);
    comm::all_reduce(world, res.step_phase_seconds.data()->data(), res.step_phase_seconds.size() * kPhases,
                     comm::DType::F64, comm::ReduceOp::Max);
    comm::all_reduce(world, res.step_device_phase_seconds.data()->data(), res.step_device_phase_seconds.size() * kPhases,
                     comm::DType::F64, comm::ReduceOp::Max);
    comm::all_reduce(world, res.step_cpu_seconds.data(), res.step_cpu_seconds.size(), comm::DType::F64,
                     comm::ReduceOp::Min);
    return res;
  }

};

}  // namespace lcplan::exec::step_detail
