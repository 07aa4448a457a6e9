// lcplan-exec's training step, once for both backends (executor/README.md): the step below is the CPU backend's
// (executor.cpp, HostBackend) and the GPU backend's (executor_cuda.cpp, DeviceBackend); its setup and report helpers
// that need no backend are step.cpp's. A Backend offers
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
#include "executor/phase_trace.h"
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
constexpr int kReportDoubles = 2 + kPhases * (1 + 2 * kCategories) + 1 + kPhases + 5;
std::vector<double> pack(const RankReport& r);
RankReport unpack(const double* v);

// This stage's units (the embedding on stage 0, its decoder layers as the plan's split places them, final norm and
// LM head on the last stage: Megatron's placement) and where each one sits in `mine`.
struct StageUnits {
  std::vector<UnitLayout> mine;
  std::vector<LayerPlace> places;              // every decoder layer's stage, virtual chunk and position
  std::vector<int> unit_of_layer;              // decoder layer -> its index in `mine` (-1: another stage's)
  std::vector<std::vector<int>> chunk_layers;  // the decoder layers of each virtual chunk on this stage, in order
  int emb = -1, fn = -1, head = -1;            // -1: not on this stage
};
StageUnits stage_units(const ModelSpec& m, const Plan& p, const Dims& d, const comm::ProcessGroups& pg);
// Where the layers run: this rank's share of the sequence and the tokens, the MoE chunk schedule (Ctx).
Ctx make_ctx(Tracker& tr, const Dims& d, const comm::ProcessGroups& pg, const ModelSpec& m, const Plan& p,
             const ExecOptions& o);
// The refusals before anything is set up: the plan, the job's size, the options.
void check_run(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o);
// Units in the order the step uses them (FSDP gathers them in this order and prefetches the next; -1: none).
std::vector<int> unit_order(const std::vector<PipeAction>& actions, const StageUnits& su, int pp, int stage);

// The step as llm.c's reads: per pipeline action the forward of a virtual stage (and on the last one the loss) or its
// backward, then the optimizer; Megatron's schedule (schedule.h) orders the actions, and a report closes the run.
template <class Backend>
class Step {
 public:
  static ExecResult run(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o, Backend& be) {
    const auto t_setup = Clock::now();
    check_run(world, m, p, o);
    Step s(world, m, p, o, be);
    s.res_.setup_seconds = since(t_setup);
    s.start_clock();
    for (int step = 1; step <= o.steps; ++step) s.train_step(step);
    return s.report();
  }

 private:
  template <class T>
  using Buf = typename Backend::template Buf<T>;
  using Ops = typename Backend::Ops;
  using Store = typename Backend::Store;
  using Saved = BasicLayerSaved<Backend::template Buf>;

  // The process groups and the pipeline links, freed when the run ends (on a throw too).
  struct Groups {
    comm::ProcessGroups pg;
    comm::PipeLinks links;
    Groups(Backend& be, const comm::Comm& world, const Plan& p) {
      const Parallel& q = p.parallel;
      pg = be.groups(world, make_rank_layout(p.gpus, q.tp, q.pp, q.cp, q.ep, q.etp));
      try {
        links = be.pipe_links(pg.pp);
      } catch (...) {
        comm::free_groups(pg);
        throw;
      }
    }
    Groups(const Groups&) = delete;
    Groups& operator=(const Groups&) = delete;
    ~Groups() {
      try {
        comm::free_pipe_links(links);
        comm::free_groups(pg);
      } catch (...) {
      }
    }
  };

  // Lets the backend's buffers of the tracker follow its stream, before the first one is made.
  struct Attached {
    Attached(Backend& be, Tracker& tr) { be.attach(tr); }
  };

  // FSDP's two gather buffers (the current unit and the prefetched next one) and the unsharded gradient of one unit,
  // each sized to the largest unit (Megatron-FSDP's double buffer): the estimator's fsdp_buffers.
  struct Fsdp {
    std::array<Buf<bf16>, 2> slot;
    std::array<int, 2> held{-1, -1};
    std::array<UnitView, 2> views{};
    Buf<float> grad;

    UnitView fetch(Store& ps, int unit, int s) {
      if (held[s] != unit) {
        views[s] = ps.gather(unit, slot[s].data());
        held[s] = unit;
      }
      return views[s];
    }
    // Unit order[i] in slot i % 2, and (prefetch) order[i + 1] gathered into the other slot ahead of its use.
    UnitView at(Store& ps, const std::vector<int>& order, size_t i, bool prefetch) {
      const UnitView v = fetch(ps, order[i], int(i % 2));
      if (prefetch && i + 1 < order.size() && order[i + 1] >= 0) fetch(ps, order[i + 1], int((i + 1) % 2));
      return v;
    }
  };

  // A pipeline message in flight and the buffer it reads.
  struct Pending {
    comm::Request req;
    Buf<bf16> act;
    Buf<float> grad;
  };

  Step(const comm::Comm& world, const ModelSpec& m, const Plan& p, const ExecOptions& o, Backend& be)
      : world_(world), m_(m), p_(p), o_(o), be_(be), g_(be, world, p), tr_(o.workspace_reserve), attached_(be, tr_),
        d_(make_dims(m, p.parallel.tp, g_.pg.tp.rank, p.parallel.etp, g_.pg.etp.rank)),
        c_(make_ctx(tr_, d_, g_.pg, m, p, o)), su_(stage_units(m, p, d_, g_.pg)),
        ps_(tr_, g_.pg, su_.mine, p.optimizer_sharding, o.seed, be.mem()), ops_(be.ops(tr_)), pp_(p.parallel.pp),
        stage_(g_.pg.pp.rank), chunks_total_(pp_ * p.parallel.vpp),
        fsdp_(p.optimizer_sharding == OptimizerSharding::Fsdp),
        M_(std::max(1, num_microbatches(p))), actions_(pipeline_schedule(pp_, p.parallel.vpp, stage_, M_, p.microbatch_group)),
        order_(unit_order(actions_, su_, pp_, stage_)),
        global_tokens_(double(effective_global_batch(p)) * double(p.seq_len)) {
    res_.microbatches = M_;
    rep_.rank = world.rank;
    rep_.stage = stage_;
  }

  int vstage(int chunk) const { return chunk * pp_ + stage_; }
  size_t hidden_elems() const { return size_t(c_.rows * d_.H); }
  Keep keep(int layer) const { return keep_of(p_, su_.places[size_t(layer)].pos); }

  // ---------------------------------------------------------------- one training step

  void train_step(int step) {
    begin_step();
    for (const PipeAction& a : actions_) {
      if (a.forward) forward_chunk(a, step);
      else backward_chunk(a, step);
      reap(false);
    }
    reap(true);
    for (auto& s : fs_.slot) s.reset();
    optimizer(step);
    end_step(step);
  }

  void begin_step() {
    t_step_ = Clock::now();
    cpu_step_ = thread_cpu_now();
    ps_.zero_grads();
    loss_sum_ = 0;
    fs_ = Fsdp{};
    if (fsdp_)
      for (auto& s : fs_.slot) s = Buf<bf16>(tr_, Category::FsdpBuffers, ps_.buffer_elems());
    fi_ = 0;
    saved_.clear();
    saved_.resize(size_t(M_));
    for (auto& per_chunk : saved_) per_chunk.resize(size_t(p_.parallel.vpp));
    loss_grad_.clear();
    loss_grad_.resize(size_t(M_));
  }

  // The next unit of order_ (FSDP: gathered into its slot, and the one after it prefetched).
  UnitView unit(int u, bool prefetch) {
    const size_t i = fi_++;
    return fsdp_ ? fs_.at(ps_, order_, i, prefetch) : ps_.view(u);
  }

  // Forward of one virtual stage for one microbatch; then the loss on the last one, else its activations sent on.
  void forward_chunk(const PipeAction& a, int step) {
    const int v = vstage(a.chunk);
    begin_phase(Phase::Forward, step, a.microbatch, v);
    Buf<float> out = forward_layers(a, saved_[size_t(a.microbatch)][size_t(a.chunk)]);
    end_phase();
    if (v == chunks_total_ - 1) loss(step, a.microbatch, out);
    else send(true, out);
  }

  // The stage's input (the embedding of the microbatch's tokens, or the previous stage's activations) through its
  // decoder layers; sv[k].x keeps layer k's input (bf16).
  Buf<float> forward_layers(const PipeAction& a, std::vector<Saved>& sv) {
    const std::vector<int>& ls = su_.chunk_layers[size_t(a.chunk)];
    sv.resize(std::max<size_t>(1, ls.size()));
    sv[0].x = Buf<bf16>(tr_, Category::Activations, hidden_elems());
    if (vstage(a.chunk) == 0) {
      Buf<int64_t> tokens, targets;
      data(a.microbatch, tokens, targets);
      const UnitView ew = unit(su_.emb, true);
      impl::embedding_forward(ops_, c_, ew.dense, tokens.data(), sv[0].x.data());
    } else {
      pp_recv(true, sv[0].x.data(), sv[0].x.size(), comm::DType::BF16);
    }
    if (ls.empty()) {  // a virtual stage without decoder layers passes its input on
      Buf<float> out = ops_.widen(sv[0].x.data(), sv[0].x.size());
      sv.clear();
      return out;
    }
    Buf<float> out;
    for (size_t k = 0; k < ls.size(); ++k) {
      const int l = ls[k], u = su_.unit_of_layer[size_t(l)];
      const UnitView w = unit(u, true);
      out = Buf<float>(tr_, Category::Workspace, hidden_elems());
      impl::layer_forward(ops_, c_, ps_.units()[size_t(u)], w, m_.layers[size_t(l)], keep(l), sv[k], out.data());
      if (k + 1 < ls.size()) {
        sv[k + 1].x = Buf<bf16>(tr_, Category::Activations, out.size());
        ops_.to_bf16(out.data(), sv[k + 1].x.data(), out.size());
      }
    }
    return out;
  }

  // The loss phase: final norm, LM head and cross-entropy, forward and backward; the gradient waits for the last
  // virtual stage's backward of the microbatch.
  void loss(int step, int mbatch, const Buf<float>& out) {
    begin_phase(Phase::Loss, step, mbatch, -1);
    Buf<int64_t> tokens, targets;
    data(mbatch, tokens, targets);
    tokens.reset();
    Buf<float> dx(tr_, Category::Workspace, hidden_elems());
    const double scale = 1.0 / global_tokens_;
    double l = 0;
    if (fsdp_) {
      const UnitView fw = unit(su_.fn, true);
      const UnitView hw = unit(su_.head, false);  // final norm still in use: nothing prefetched over it
      // The LM head's and final norm's gradients are reduce-scattered straight from the loss's own fp32 buffers
      // (workspace), so the unit-gradient buffer first exists in the backward phase, as the estimator has it.
      Buf<float> hg(tr_, Category::Workspace, ps_.unit_buffer_elems(su_.head));
      Buf<float> fg(tr_, Category::Workspace, ps_.unit_buffer_elems(su_.fn));
      l = impl::loss_forward_backward(ops_, c_, fw.dense, hw.dense, fg.data(), hg.data(), out.data(), targets.data(),
                                      scale, dx.data());
      ps_.reduce_into_shard(su_.head, hg.data());
      ps_.reduce_into_shard(su_.fn, fg.data());
    } else {
      unit(su_.fn, false);
      unit(su_.head, false);
      l = impl::loss_forward_backward(ops_, c_, ps_.view(su_.fn).dense, ps_.view(su_.head).dense,
                                      ps_.grad(su_.fn).dense, ps_.grad(su_.head).dense, out.data(), targets.data(),
                                      scale, dx.data());
    }
    if (g_.pg.tp.rank == 0) loss_sum_ += l;  // every TP rank computed the whole loss
    loss_grad_[size_t(mbatch)] = std::move(dx);
    end_phase();
  }

  // Backward of one virtual stage for one microbatch: its layers in reverse, then the embedding's gradient on the
  // first virtual stage, else the input gradient sent back.
  void backward_chunk(const PipeAction& a, int step) {
    const int v = vstage(a.chunk);
    begin_phase(Phase::Backward, step, a.microbatch, v);
    if (fsdp_) fs_.grad = Buf<float>(tr_, Category::FsdpBuffers, ps_.buffer_elems());
    Buf<float> dx;
    if (v == chunks_total_ - 1) {
      dx = std::move(loss_grad_[size_t(a.microbatch)]);
    } else {
      dx = Buf<float>(tr_, Category::Workspace, hidden_elems());
      pp_recv(false, dx.data(), dx.size(), comm::DType::F32);
    }
    backward_layers(a, dx);
    if (v == 0) embedding_backward(a.microbatch, dx);
    else send(false, dx);
    if (fsdp_) fs_.grad.reset();
    end_phase();
  }

  // The chunk's decoder layers in reverse; dx: the gradient of the stage's output in, of its input out.
  void backward_layers(const PipeAction& a, Buf<float>& dx) {
    const std::vector<int>& ls = su_.chunk_layers[size_t(a.chunk)];
    std::vector<Saved>& sv = saved_[size_t(a.microbatch)][size_t(a.chunk)];
    for (int k = int(ls.size()) - 1; k >= 0; --k) {
      const int l = ls[size_t(k)], u = su_.unit_of_layer[size_t(l)];
      Buf<float> dprev(tr_, Category::Workspace, hidden_elems());
      const UnitView w = unit(u, true);
      const UnitGrad g = fsdp_ ? ps_.buffer_grad(u, fs_.grad.data()) : ps_.grad(u);
      impl::layer_backward(ops_, c_, ps_.units()[size_t(u)], w, g, m_.layers[size_t(l)], keep(l), sv[size_t(k)],
                           dx.data(), dprev.data());
      if (fsdp_) ps_.reduce_into_shard(u, fs_.grad.data());
      dx = std::move(dprev);
    }
    sv.clear();
  }

  // The embedding's backward: the rows' gradients scatter-added into its table.
  void embedding_backward(int mbatch, const Buf<float>& dx) {
    Buf<int64_t> tokens, targets;
    data(mbatch, tokens, targets);
    const UnitGrad g = fsdp_ ? ps_.buffer_grad(su_.emb, fs_.grad.data()) : ps_.grad(su_.emb);
    impl::embedding_backward(ops_, c_, tokens.data(), dx.data(), g.dense);
    if (fsdp_) ps_.reduce_into_shard(su_.emb, fs_.grad.data());
  }

  // The optimizer phase: gradients reduced, the step's loss and gradient norm summed over every rank, Adam.
  void optimizer(int step) {
    begin_phase(Phase::Optimizer, step, -1, -1);
    sum_tied_embedding();
    ps_.sync_grads();
    double sums[2] = {loss_sum_, ps_.grad_sq_owned()};
    // The step's one all-rank collective: a stage that finished its pipeline work early (the drain) waits here.
    const double t_sums = since(origin_);
    comm::all_reduce(world_, sums, 2, comm::DType::F64, comm::ReduceOp::Sum);
    segments_.push_back(PhaseSegment{Phase::Optimizer, step, -1, -1, t_sums, since(origin_), true});
    ps_.adam_step(step, o_.adam);
    end_phase();
    tr_.clear_phase();
    res_.loss.push_back(sums[0] / global_tokens_);
    res_.grad_norm.push_back(std::sqrt(sums[1]));
  }

  // A tied embedding's two copies (first stage: embedding, last stage: LM head) get the sum of both gradients
  // (Megatron's embedding group all-reduce).
  void sum_tied_embedding() {
    const bool first = stage_ == 0, last = stage_ == pp_ - 1;
    if (!d_.tied || pp_ == 1 || !(first || last)) return;
    const int u = first ? su_.emb : su_.head, peer = first ? pp_ - 1 : 0;
    const size_t len = ps_.dense_grad_size(u);
    Buf<float> other(tr_, Category::Workspace, len);
    comm::sendrecv(g_.pg.pp, ps_.dense_grad_array(u), other.data(), len, comm::DType::F32, peer, 17000);
    ops_.accumulate(other.data(), ps_.dense_grad_array(u), len);  // a + b == b + a: both copies stay identical
  }

  // The step's times: wall, per phase (host and device clocks), this thread's CPU and the pipeline wait.
  void end_step(int step) {
    res_.step_seconds.push_back(since(t_step_));
    const std::array<double, kPhases> this_step = phase_totals(segments_, step);
    for (int ph = 0; ph < kPhases; ++ph) rep_.phase_seconds[size_t(ph)] += this_step[size_t(ph)];
    res_.step_phase_seconds.push_back(this_step);
    const std::array<double, kPhases> device_now = be_.device_phase_seconds();
    std::array<double, kPhases> device_step{};
    for (int ph = 0; ph < kPhases; ++ph) device_step[size_t(ph)] = device_now[size_t(ph)] - device_before_[size_t(ph)];
    res_.step_device_phase_seconds.push_back(device_step);
    device_before_ = device_now;
    res_.step_cpu_seconds.push_back(thread_cpu_now() - cpu_step_);
    res_.step_pipeline_wait_seconds.push_back(pipeline_wait_seconds(segments_, step));
    if (!o_.gather_segments) segments_.clear();  // bounded by one step's segments
  }

  // ---------------------------------------------------------------- data and pipeline messages

  // Token ids and targets of every local token of microbatch `mbatch`: its sequence j is sample (mbatch dp + d) n + j
  // of the n sequences per microbatch (micro_batch, or a packed microbatch's segments, positions from 0 in each), so
  // packing L and L feeds the same tokens as micro_batch 2 of L; under CP a rank holds each sequence's chunks r and
  // 2 cp - 1 - r.
  void data(int mbatch, Buf<int64_t>& tokens, Buf<int64_t>& targets) {
    std::vector<int64_t> tok(size_t(c_.tokens)), tgt(size_t(c_.tokens));
    const int64_t n = impl::sequences(c_);
    Ctx c = c_;
    impl::for_each_sequence(c, [&](int64_t at, int j, Ctx& s) {
      const int64_t sample = (int64_t(mbatch) * g_.pg.dp.size + g_.pg.dp.rank) * n + j;
      for (int64_t r = 0; r < s.seq_local; ++r) {
        const int64_t pos = s.chunk_start(int(r / s.chunk_len)) + r % s.chunk_len;
        tok[size_t(at + r)] = data_token(o_.seed, sample, pos, d_.V);
        tgt[size_t(at + r)] = data_token(o_.seed, sample, pos + 1, d_.V);
      }
    });
    tokens = be_.ids(tr_, tok);
    targets = be_.ids(tr_, tgt);
  }

  // Point-to-point messages between pipeline stages (Megatron p2p_communication): a virtual stage's output
  // activations (bf16, this rank's sequence-parallel rows) to the next, input gradients (fp32) to the previous, each
  // direction on its own link. One tag for all: a link's messages match in the order they were sent, on MPI as on
  // NCCL (which has no tags), so the CPU tests run the order the GPU relies on (schedule.h
  // pipeline_message_order_error proves it for every schedule).
  static constexpr int kPipeTag = 0;

  // A receive inside the open phase, kept as a wait segment (the bubble this rank sits through).
  void pp_recv(bool forward, void* buf, size_t count, comm::DType t) {
    const double t0 = since(origin_);
    const comm::Comm& in = forward ? g_.links.fwd_in : g_.links.bwd_in;
    comm::recv(in, buf, count, t, comm::link_peer(in), kPipeTag);
    be_.after_recv();
    const double t1 = since(origin_);
    segments_.push_back(PhaseSegment{open_.phase, open_.step, open_.microbatch, open_.vstage, t0, t1, true});
  }

  // Activations (forward, as bf16) to the next virtual stage or an input gradient (fp32) to the previous one.
  void send(bool forward, Buf<float>& x) {
    Pending s;
    if (forward) {
      s.act = Buf<bf16>(tr_, Category::Workspace, x.size());
      ops_.to_bf16(x.data(), s.act.data(), x.size());
    } else {
      s.grad = std::move(x);
    }
    be_.before_send();
    const comm::Comm& out = forward ? g_.links.fwd_out : g_.links.bwd_out;
    const void* buf = forward ? static_cast<const void*>(s.act.data()) : static_cast<const void*>(s.grad.data());
    const size_t n = forward ? s.act.size() : s.grad.size();
    s.req = comm::isend(out, buf, n, forward ? comm::DType::BF16 : comm::DType::F32, comm::link_peer(out), kPipeTag);
    sends_.push_back(std::move(s));
  }

  // Completed sends release their buffers (all_of_them: waits for every one).
  void reap(bool all_of_them) {
    for (size_t i = 0; i < sends_.size();) {
      if (all_of_them) comm::wait(sends_[i].req);
      if (all_of_them || comm::test(sends_[i].req)) {
        sends_.erase(sends_.begin() + long(i));
      } else {
        ++i;
      }
    }
  }

  // ---------------------------------------------------------------- phases and the report

  // The phase trace's common origin on every rank.
  void start_clock() {
    comm::barrier(world_);
    origin_ = Clock::now();
    cpu0_ = cpu_now();
    device_before_ = be_.device_phase_seconds();
  }

  // Phase segments on the host clock: one reading at each boundary is both the phase's time and its trace mark.
  void begin_phase(Phase ph, int step, int mbatch, int vst) {
    tr_.set_phase(ph);
    be_.phase_begin(ph);
    open_ = PhaseMark{ph, true, step, mbatch, vst, since(origin_)};
    if (o_.on_phase) o_.on_phase(open_);
  }
  void end_phase() {
    be_.phase_end(tr_, open_.phase);  // the device's work of the phase is done before its end is read off the clock
    PhaseMark m = open_;
    m.begin = false;
    m.seconds = since(origin_);
    segments_.push_back(PhaseSegment{m.phase, m.step, m.microbatch, m.vstage, open_.seconds, m.seconds});
    if (o_.on_phase) o_.on_phase(m);
  }

  // The run's result on every rank: every rank's report, segments (when gathered) and the slowest rank's times.
  ExecResult report() {
    for (int ph = 0; ph < kPhases; ++ph) rep_.phases[ph] = tr_.peak(Phase(ph));
    res_.notes = be_.notes();
    res_.backend = be_.name();
    res_.device = be_.device();
    rep_.workspace_high_water = tr_.workspace_high_water();
    rep_.moe_rows_received = c_.moe_rows_received;
    rep_.moe_rows_sent = c_.moe_rows_sent;
    rep_.attention_pairs = c_.attention_pairs;
    rep_.tracker_ops = double(tr_.operations());
    rep_.cpu_seconds = cpu_now() - cpu0_;
    gather_reports();
    if (o_.gather_segments) gather_segments();
    reduce_step_times();
    return std::move(res_);
  }

  // Every rank's report to every rank (the step time is the slowest rank's).
  void gather_reports() {
    const std::vector<double> mine = pack(rep_);
    if (mine.size() != size_t(kReportDoubles)) throw std::logic_error("executor: RankReport packs to a size kReportDoubles does not state");
    std::vector<double> all(size_t(kReportDoubles) * size_t(world_.size));
    comm::all_gather(world_, mine.data(), all.data(), kReportDoubles, comm::DType::F64);
    for (int r = 0; r < world_.size; ++r) res_.ranks.push_back(unpack(all.data() + size_t(r) * kReportDoubles));
  }

  // Every rank's phase segments (stages hold different counts: padded to the longest).
  void gather_segments() {
    double count = double(segments_.size());
    std::vector<double> counts(size_t(world_.size));
    comm::all_gather(world_, &count, counts.data(), 1, comm::DType::F64);
    size_t most = 0;
    for (double n : counts) most = std::max(most, size_t(n));
    std::vector<double> mine(most * kSegmentDoubles), all(mine.size() * size_t(world_.size));
    for (size_t i = 0; i < segments_.size(); ++i) pack_segment(segments_[i], mine.data() + i * kSegmentDoubles);
    if (most > 0) comm::all_gather(world_, mine.data(), all.data(), mine.size(), comm::DType::F64);
    res_.segments.resize(size_t(world_.size));
    for (int r = 0; r < world_.size; ++r)
      for (size_t i = 0; i < size_t(counts[size_t(r)]); ++i)
        res_.segments[size_t(r)].push_back(unpack_segment(all.data() + (size_t(r) * most + i) * kSegmentDoubles));
  }

  // Per step: the least pipeline wait and CPU time, the most wall and phase seconds over the ranks.
  void reduce_step_times() {
    using comm::DType;
    using comm::ReduceOp;
    comm::all_reduce(world_, res_.step_pipeline_wait_seconds.data(), res_.step_pipeline_wait_seconds.size(),
                     DType::F64, ReduceOp::Min);
    comm::all_reduce(world_, res_.step_seconds.data(), res_.step_seconds.size(), DType::F64, ReduceOp::Max);
    comm::all_reduce(world_, res_.step_phase_seconds.data()->data(), res_.step_phase_seconds.size() * kPhases,
                     DType::F64, ReduceOp::Max);
    comm::all_reduce(world_, res_.step_device_phase_seconds.data()->data(),
                     res_.step_device_phase_seconds.size() * kPhases, DType::F64, ReduceOp::Max);
    comm::all_reduce(world_, res_.step_cpu_seconds.data(), res_.step_cpu_seconds.size(), DType::F64, ReduceOp::Min);
  }

  // What the run was given.
  const comm::Comm& world_;
  const ModelSpec& m_;
  const Plan& p_;
  const ExecOptions& o_;
  Backend& be_;
  // Set up once (the constructor, in this order).
  Groups g_;
  Tracker tr_;
  Attached attached_;
  Dims d_;
  Ctx c_;
  StageUnits su_;
  Store ps_;
  Ops ops_;
  int pp_, stage_, chunks_total_;
  bool fsdp_;
  int M_;
  std::vector<PipeAction> actions_;
  std::vector<int> order_;
  double global_tokens_;
  // The run's record and this rank's report, the phase segments and their clock.
  ExecResult res_;
  RankReport rep_;
  std::vector<PhaseSegment> segments_;
  PhaseMark open_;
  Clock::time_point origin_;
  double cpu0_ = 0;
  std::array<double, kPhases> device_before_{};
  // The step in progress: its clocks, FSDP buffers and unit cursor, the saved tensors per (microbatch, chunk), the
  // loss's gradients waiting for the last chunk's backward, the pipeline sends in flight.
  Clock::time_point t_step_;
  double cpu_step_ = 0, loss_sum_ = 0;
  Fsdp fs_;
  size_t fi_ = 0;
  std::vector<std::vector<std::vector<Saved>>> saved_;
  std::vector<Buf<float>> loss_grad_;
  std::vector<Pending> sends_;
};

}  // namespace lcplan::exec::step_detail
