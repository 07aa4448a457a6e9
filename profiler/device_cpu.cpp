// The CPU backend: Eigen fp32 GEMMs, the project's CPU kernels (kernels/*), MPI collectives; steady-clock timing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <Eigen/Dense>

#include "kernels/linear_ce/linear_ce.h"
#include "kernels/moe/cpu_gemm.h"
#include "kernels/moe/moe_cpu.h"
#include "kernels/moe/moe_math.h"
#include "parallel/chunk_schedule.h"
#include "profiler/device.h"
#include "profiler/machine.h"
#include "profiler/timing.h"

namespace lcplan::profiler {

namespace {

// Deterministic values in [lo, hi) (a multiplicative hash of the index: no RNG state to carry).
void fill(float* p, size_t n, float lo, float hi, uint32_t salt) {
  for (size_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * float(((i + salt) * 2654435761u) % 10007u) / 10007.0f;
}
std::vector<float> values(size_t n, float lo, float hi, uint32_t salt) {
  std::vector<float> v(n);
  fill(v.data(), n, lo, hi, salt);
  return v;
}

// Which stream each step of a pass ran on, and its measured interval.
void stream_intervals(const std::vector<moe::Step>& steps, const std::vector<moe::StepTime>& t,
                      std::vector<Interval>& compute, std::vector<Interval>& comm) {
  compute.clear(), comm.clear();
  for (size_t i = 0; i < steps.size() && i < t.size(); ++i)
    (steps[i].stream == moe::StreamKind::Comm ? comm : compute).push_back({t[i].start, t[i].end});
}

class CpuDevice final : public Device {
 public:
  CpuDevice(const comm::Comm& world, const RepeatOptions& o) : world_(world), o_(o) {}

  std::string backend() const override { return "cpu"; }
  std::string description() const override {
    const CpuMachine m = cpu_machine();
    return m.model + ", " + std::to_string(m.logical_cpus) + " logical CPUs, " + cpu_library_versions();
  }
  std::vector<std::string> gemm_types() const override { return {"fp32"}; }

  Timing gemm(int64_t m, int64_t n, int64_t k, const std::string& type) override {
    if (type != "fp32") throw std::invalid_argument("the CPU backend times fp32 GEMMs only, not " + type);
    Eigen::MatrixXf a(m, k), b(k, n), c(m, n);
    fill(a.data(), size_t(a.size()), -1, 1, 1);
    fill(b.data(), size_t(b.size()), -1, 1, 2);
    return time_repeats(world_, o_, [&] { c.noalias() = a * b; });
  }

  Timing grouped_gemm(int experts, int64_t tokens, int64_t hidden, int64_t ffn) override {
    const size_t E = size_t(experts), T = size_t(tokens), H = size_t(hidden), F = size_t(ffn);
    const std::vector<float> x = values(E * T * H, -1, 1, 3), w1 = values(E * H * 2 * F, -0.05f, 0.05f, 4),
                             w2 = values(E * F * H, -0.05f, 0.05f, 5);
    std::vector<float> h1(T * 2 * F), act(T * F), y(E * T * H);
    return time_repeats(world_, o_, [&] {
      for (size_t e = 0; e < E; ++e) {
        moe::cpu::gemm_rows(x.data() + e * T * H, w1.data() + e * H * 2 * F, h1.data(), int64_t(T), int(H), int(2 * F), {},
                            int(T));
        for (size_t t = 0; t < T; ++t)
          for (size_t j = 0; j < F; ++j) act[t * F + j] = moe::swiglu(h1[t * 2 * F + j], h1[t * 2 * F + F + j]);
        moe::cpu::gemm_rows(act.data(), w2.data() + e * F * H, y.data() + e * T * H, int64_t(T), int(F), int(H), {}, int(T));
      }
    });
  }

  Timing attention(const attention::Shape& s) override {
    attention::Options opt;
    attention::validate(s, opt);
    const size_t nq = size_t(s.sq * s.hq * s.d), nk = size_t(s.sk * s.hkv * s.d);
    const std::vector<float> q = values(nq, -1, 1, 6), k = values(nk, -1, 1, 7), v = values(nk, -1, 1, 8),
                             dout = values(nq, -1, 1, 9);
    std::vector<float> o(nq), lse(size_t(s.hq * s.sq)), dq(nq), dk(nk), dv(nk);
    return time_repeats(world_, o_, [&] {
      attention::forward_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(), opt);
      attention::backward_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                              dv.data(), opt);
    });
  }

  Timing linear_attention(const linear_attention::Shape& s) override {
    linear_attention::Options opt;
    linear_attention::validate(s, opt);
    const size_t S = size_t(s.s), nk = size_t(s.s * s.hk * s.dk), nv = size_t(s.s * s.hv * s.dv), ng = size_t(s.s * s.hv);
    linear_attention::Conv conv;
    conv.s = s.s;
    conv.channels = 2 * s.hk * s.dk + s.hv * s.dv;  // q, k and v go through the conv (Qwen3.5 mixed_qkv)
    const size_t C = size_t(conv.channels);
    const std::vector<float> x = values(S * C, -1, 1, 10), cw = values(C * size_t(conv.kernel), -0.5f, 0.5f, 11),
                             dy = values(S * C, -1, 1, 12);
    std::vector<float> y(S * C), dx(S * C), dcw(C * size_t(conv.kernel));
    const std::vector<float> q = values(nk, -1, 1, 13), k = values(nk, -1, 1, 14), v = values(nv, -1, 1, 15),
                             g = values(ng, -0.3f, -0.01f, 16), beta = values(ng, 0.1f, 0.9f, 17), dout = values(nv, -1, 1, 18);
    std::vector<float> o(nv), dq(nk), dk(nk), dv(nv), dg(ng), dbeta(ng);
    return time_repeats(world_, o_, [&] {
      linear_attention::conv1d_forward_cpu(conv, x.data(), nullptr, cw.data(), nullptr, y.data());
      linear_attention::forward_cpu(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, o.data(), nullptr, opt);
      linear_attention::backward_cpu(s, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, dout.data(), nullptr,
                                     dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), nullptr, opt);
      linear_attention::conv1d_backward_cpu(conv, x.data(), nullptr, cw.data(), nullptr, dy.data(), dx.data(), nullptr,
                                            dcw.data(), nullptr);
    });
  }

  Timing linear_ce(int64_t tokens, int64_t hidden, int64_t vocab, int64_t vocab_tile, int64_t token_tile,
                   bool materialized) override {
    namespace ce = linear_ce;
    ce::Problem p{tokens, hidden, vocab};
    ce::Options opt;
    opt.vocab_tile = vocab_tile;
    opt.token_tile = token_tile;
    ce::validate(p, opt);
    const std::vector<float> h = values(size_t(tokens * hidden), -1, 1, 19), w = values(size_t(vocab * hidden), -0.1f, 0.1f, 20);
    std::vector<int64_t> targets(static_cast<size_t>(tokens));
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = int64_t((i * 2654435761u) % uint64_t(vocab));
    std::vector<float> dh(h.size()), dw(w.size()), lse(static_cast<size_t>(tokens));
    float loss = 0, grad = 1;
    return time_repeats(world_, o_, [&] {
      if (materialized) {
        ce::forward_naive_cpu(p, ce::DType::F32, h.data(), w.data(), targets.data(), &loss, lse.data(), opt);
        ce::backward_naive_cpu(p, ce::DType::F32, h.data(), w.data(), targets.data(), lse.data(), &grad, dh.data(),
                               dw.data(), opt);
      } else {
        ce::forward_cpu(p, ce::DType::F32, h.data(), w.data(), targets.data(), &loss, lse.data(), opt);
        ce::backward_cpu(p, ce::DType::F32, h.data(), w.data(), targets.data(), lse.data(), &grad, dh.data(), dw.data(), opt);
      }
    });
  }
  std::string linear_ce_type() const override { return "fp32"; }

  MoeTiming moe_layer(const comm::Comm& ep, const MoeShape& s) override {
    const moe::MoeWeights w = moe::make_weights(s.config, ep.rank, ep.size, 1234);
    moe::MoeWeights grads = moe::zeros_like(w);
    const moe::ChunkSchedule sched = moe::make_chunk_schedule(s.chunks, {}, s.config.shared_ffn > 0);
    const size_t n = size_t(s.tokens) * size_t(s.config.hidden);
    const std::vector<float> x = values(n, -1, 1, uint32_t(21 + ep.rank)), dout = values(n, -1, 1, uint32_t(31 + ep.rank));
    std::vector<float> out(n), dx(n);
    moe::ExecOptions eo;
    eo.overlap = s.overlap;
    std::vector<moe::StepTime> tf, tb;
    std::vector<double> fwd, bwd;
    std::vector<OverlapSummary> sf, sb;
    for (int i = 0; i < o_.warmup + o_.repeats; ++i) {
      moe::MoeSaved saved;
      comm::barrier(ep);
      const auto t0 = std::chrono::steady_clock::now();
      moe::moe_forward(ep, s.config, w, sched, x.data(), int(s.tokens), out.data(), saved, eo, &tf);
      const auto t1 = std::chrono::steady_clock::now();
      moe::moe_backward(ep, s.config, w, sched, saved, dout.data(), dx.data(), grads, eo, &tb);
      const auto t2 = std::chrono::steady_clock::now();
      if (i < o_.warmup) continue;
      fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
      std::vector<Interval> cf, mf, cb, mb;
      stream_intervals(sched.forward, tf, cf, mf);
      stream_intervals(sched.backward, tb, cb, mb);
      sf.push_back(overlap_summary(cf, mf));
      sb.push_back(overlap_summary(cb, mb));
    }
    fwd = slowest_rank(ep, fwd);
    bwd = slowest_rank(ep, bwd);
    MoeTiming t;
    t.forward = summarize(fwd).seconds;
    t.backward = summarize(bwd).seconds;
    // The stream summary of the repeat whose forward + backward is the median one.
    std::vector<size_t> order(fwd.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return fwd[a] + bwd[a] < fwd[b] + bwd[b]; });
    if (!order.empty()) {
      t.fwd = sf[order[order.size() / 2]];
      t.bwd = sb[order[order.size() / 2]];
    }
    return t;
  }

  Timing collective(const comm::Comm& g, Coll c, size_t bytes, int inner) override {
    const size_t n = size_t(g.size), floats = std::max<size_t>(bytes / 4, n);
    const size_t per = floats / n;  // per-rank share (all-gather input, reduce-scatter output, all-to-all per peer)
    std::vector<float> a = values(floats, -1, 1, 40), b(floats);
    std::vector<size_t> counts(n, per), displs(n);
    for (size_t r = 0; r < n; ++r) displs[r] = r * per;
    const int next = (g.rank + 1) % g.size, prev = (g.rank + g.size - 1) % g.size;
    auto once = [&] {
      switch (c) {
        case Coll::AllReduce: comm::all_reduce(g, a.data(), floats, comm::DType::F32, comm::ReduceOp::Sum); break;
        case Coll::AllGather: comm::all_gather(g, a.data(), b.data(), per, comm::DType::F32); break;
        case Coll::ReduceScatter:
          comm::reduce_scatter(g, a.data(), b.data(), per, comm::DType::F32, comm::ReduceOp::Sum);
          break;
        case Coll::AllToAll:
          comm::all_to_all_v(g, a.data(), counts.data(), displs.data(), b.data(), counts.data(), displs.data(),
                             comm::DType::F32);
          break;
        case Coll::SendRecv: {
          // Every rank sends to the next and receives from the previous at once (nccl-tests sendrecv).
          comm::Request r = comm::irecv(g, b.data(), floats, comm::DType::F32, prev);
          comm::Request s = comm::isend(g, a.data(), floats, comm::DType::F32, next);
          comm::wait(s);
          comm::wait(r);
          break;
        }
      }
    };
    // Timed per group, then the slowest rank of the whole world (every group of the kind runs at once).
    for (int i = 0; i < o_.warmup; ++i) once();
    std::vector<double> s;
    for (int i = 0; i < o_.repeats; ++i) {
      comm::barrier(g);
      const auto t0 = std::chrono::steady_clock::now();
      for (int j = 0; j < inner; ++j) once();
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner);
    }
    return summarize(slowest_rank(world_, s));
  }

  Timing copy(size_t bytes) override {
    std::vector<float> a = values(bytes / 4, -1, 1, 50), b(bytes / 4);
    return time_repeats(world_, o_, [&] { std::memcpy(b.data(), a.data(), a.size() * sizeof(float)); });
  }

  Timing launch() override {
    // The smallest call into the project's CPU GEMM: what a kernel costs before it does any work.
    constexpr int kCalls = 2000;
    const std::vector<float> a = values(8, -1, 1, 60), b = values(64, -1, 1, 61);
    std::vector<float> c(8);
    return time_repeats(world_, o_, [&] {
      for (int i = 0; i < kCalls; ++i) moe::cpu::gemm_nn(a.data(), b.data(), c.data(), 1, 8, 8);
    }, kCalls);
  }
  std::string launch_what() const override { return "1x8x8 fp32 GEMM call into kernels/moe/cpu_gemm.h"; }

  comm::Comm split(const std::vector<int>& ranks) override { return comm::split(world_, ranks); }
  void free(comm::Comm& c) override { comm::free_comm(c); }

 private:
  const comm::Comm& world_;
  RepeatOptions o_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const comm::Comm& world, const RepeatOptions& o) {
  return std::make_unique<CpuDevice>(world, o);
}

}  // namespace lcplan::profiler
