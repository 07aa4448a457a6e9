#include "executor/executor.h"

#include "executor/layer_ops_host.h"
#include "executor/step_impl.h"

namespace lcplan::exec {

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
