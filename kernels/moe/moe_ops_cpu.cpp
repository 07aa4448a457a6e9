#include "kernels/moe/moe_ops_cpu.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace lcplan::moe::cpu {

void MoeOps::all_to_all_step(const comm::Comm& c, const float* send, const size_t* send_counts,
                             const size_t* send_displs, float* recv, const size_t* recv_counts,
                             const size_t* recv_displs) {
  if (!pending_) throw std::logic_error("MoE all-to-all step issued outside a comm step of run_steps");
  *pending_ = comm::iall_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, comm::DType::F32);
}

void MoeOps::run_steps(const std::vector<Step>& steps, const std::function<void(const Step&)>& issue) {
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const size_t n = steps.size();
  if (times) times->assign(n, StepTime{});
  std::vector<char> done(n, 0);
  std::vector<int> comm_q, comp_q;
  for (size_t i = 0; i < n; ++i) (steps[i].stream == StreamKind::Comm ? comm_q : comp_q).push_back(int(i));
  size_t ci = 0, pi = 0;
  int inflight = -1;
  comm::Request req;
  auto ready = [&](int i) {
    for (int d : steps[size_t(i)].deps)
      if (!done[size_t(d)]) return false;
    return true;
  };
  auto finish = [&](int i) {
    done[size_t(i)] = 1;
    if (times) (*times)[size_t(i)].end = now();
  };
  // Lands the comm step in flight when it is done, then starts the next ones that are ready (a step that issued no
  // request is done at once).
  std::function<void()> advance = [&] {
    if (inflight >= 0) {
      if (!comm::test(req)) return;
      finish(inflight);
      inflight = -1;
      ++ci;
    }
    while (inflight < 0 && ci < comm_q.size() && ready(comm_q[ci])) {
      const int i = comm_q[ci];
      if (times) (*times)[size_t(i)].start = now();
      pending_ = &req;
      issue(steps[size_t(i)]);
      pending_ = nullptr;
      if (!exec.overlap) comm::wait(req);
      if (!comm::test(req)) {
        inflight = i;
        return;
      }
      finish(i);
      ++ci;
    }
  };
  const Poll polled = exec.overlap ? advance : Poll{};
  while (ci < comm_q.size() || pi < comp_q.size() || inflight >= 0) {
    advance();
    if (pi < comp_q.size() && ready(comp_q[pi])) {
      const int i = comp_q[pi];
      if (times) (*times)[size_t(i)].start = now();
      poll_ = &polled;
      issue(steps[size_t(i)]);
      poll_ = nullptr;
      finish(i);
      ++pi;
    } else if (inflight >= 0) {
      comm::wait(req);  // nothing to compute until this lands
      finish(inflight);
      inflight = -1;
      ++ci;
    } else if (!(ci < comm_q.size() && ready(comm_q[ci]))) {
      throw std::logic_error("MoE schedule stalled: no step can run (invalid step list)");
    }
  }
}

}  // namespace lcplan::moe::cpu
