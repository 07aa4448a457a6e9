#include "executor/executor.h"

#include <chrono>
#include <ctime>

#include "executor/layer_ops_host.h"
#include "executor/step_impl.h"

namespace lcplan::exec {

namespace step_detail {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double cpu_now() { return double(std::clock()) / CLOCKS_PER_SEC; }  // this process's CPU time
double thread_cpu_now() {  // this thread's CPU time (MPI's helper threads excluded)
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// `pos`: the layer's position in its virtual stage.
Keep keep_of(const Plan& p, int pos) {
  switch (p.recompute) {
    case Recompute::None: return Keep::All;
    case Recompute::Selective: return Keep::Selective;
    case Recompute::Full:  // Megatron's block method: the first recompute_layers layers (0 = all) of each virtual stage
      return p.recompute_layers == 0 || pos < p.recompute_layers ? Keep::InputOnly : Keep::All;
  }
  return Keep::All;
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
  r.tracker_ops = v[i++];
  r.cpu_seconds = v[i++];
  return r;
}

}  // namespace step_detail

namespace {

// The CPU backend of the step (step_impl.h): host Bufs, HostOps, the host store on MPI groups.
struct HostBackend {
  template <class T>
  using Buf = exec::Buf<T>;
  using Ops = HostOps;
  using Store = ParamStore;
  comm::ProcessGroups groups(const comm::Comm& world, const RankLayout& l) const {
    return comm::make_process_groups(world, l);
  }
  HostMem mem() const { return {}; }
  HostOps ops(Tracker& t) const { return HostOps{t}; }
  Buf<int64_t> ids(Tracker& t, const std::vector<int64_t>& v) const {
    Buf<int64_t> b(t, Category::Workspace, v.size());
    std::copy(v.begin(), v.end(), b.data());
    return b;
  }
  void attach(Tracker&) const {}
  comm::PipeLinks pipe_links(const comm::Comm& pp) const { return comm::make_pipe_links(pp, nullptr, nullptr, nullptr); }
  void before_send() const {}
  void after_recv() const {}
  void phase_begin(Phase) const {}
  void phase_end(const Tracker&, Phase) const {}
  std::array<double, kPhases> device_phase_seconds() const { return {}; }
  std::string name() const { return "cpu"; }
  std::string device() const { return "cpu"; }
  std::vector<std::string> notes() const { return {}; }
};

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
  HostBackend be;
  return step_detail::Step<HostBackend>::run(world, m, p, o, be);
}

}  // namespace lcplan::exec
