// The CPU MoE layer: moe_pass.h on host vectors with the CPU ops (moe_ops_cpu.h), and the layer's argument checks.
#include "kernels/moe/moe_cpu.h"

#include <algorithm>
#include <string>

namespace lcplan::moe {

namespace {

// A row block below one would never advance through the GEMM rows.
std::string poll_error(const ExecOptions& o) {
  return o.poll_rows >= 1 ? "" : "ExecOptions::poll_rows = " + std::to_string(o.poll_rows) + " must be at least 1";
}

MoeParams params_of(const MoeConfig& c, const MoeWeights& w) {
  MoeParams p;
  p.router = w.router.data();
  p.bias = c.router == Router::SigmoidGroupLimited ? w.expert_bias.data() : nullptr;
  p.w1 = w.w1.data();
  p.w2 = w.w2.data();
  p.shared_w1 = w.shared_w1.data();
  p.shared_w2 = w.shared_w2.data();
  p.shared_gate = w.shared_gate.data();
  return p;
}

MoeGrads grads_of(MoeWeights& g) {
  return {g.router.data(), g.w1.data(), g.w2.data(), g.shared_w1.data(), g.shared_w2.data(), g.shared_gate.data()};
}

cpu::LayerOps layer_ops(const ExecOptions& o, std::vector<StepTime>* times) {
  cpu::LayerOps ops;
  ops.exec = o;
  ops.times = times;
  return ops;
}

const comm::Comm kNoGroup{};  // a size-1 group: no tensor parallelism of the shared expert

}  // namespace

void check_moe_args(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s) {
  check_moe_args(ep, comm::Comm{}, c, w, tokens, s);
}

void check_moe_args(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w, int tokens,
                    const ChunkSchedule& s) {
  // Local checks first, then one collective verdict: a rank with bad input must not leave the others waiting.
  std::string err = moe_config_error(c, ep.size);
  if (err.empty() && (c.expert_ffn % etp.size != 0 || local_ffn(c, w) * etp.size != c.expert_ffn))
    err = "the weights hold " + std::to_string(local_ffn(c, w)) + " FFN columns per expert but expert_ffn / ETP = " +
          std::to_string(c.expert_ffn) + " / " + std::to_string(etp.size) + "; choose an ETP size that divides expert_ffn";
  if (err.empty() && w.local_experts * ep.size != c.experts)
    err = "the weights hold " + std::to_string(w.local_experts) + " experts per rank but experts / EP = " +
          std::to_string(c.experts) + " / " + std::to_string(ep.size);
  if (err.empty() && s.chunks > tokens)
    err = "ep_chunks = " + std::to_string(s.chunks) + " is more than the " + std::to_string(tokens) +
          " local tokens on EP rank " + std::to_string(ep.rank) + "; use at most " +
          std::to_string(std::max(1, tokens)) + " chunks";
  comm::raise_if_any(ep, err);
  comm::require_same(ep, c.hidden, "hidden");
  comm::require_same(ep, (static_cast<long long>(c.experts) << 20) | c.top_k, "experts/top_k");
  comm::require_same(ep, (static_cast<long long>(c.expert_ffn) << 24) | c.shared_ffn, "expert_ffn/shared_ffn");
  comm::require_same(ep, s.chunks, "ep_chunks");
  if (etp.size > 1) {
    comm::raise_if_any(etp, err);
    comm::require_same(etp, (static_cast<long long>(c.experts) << 20) | c.top_k, "experts/top_k");
    comm::require_same(etp, (static_cast<long long>(c.expert_ffn) << 24) | s.chunks, "expert_ffn/ep_chunks");
  }
}

void moe_forward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                 const float* x, int tokens, float* out, MoeSaved& sv, const ExecOptions& o,
                 std::vector<StepTime>* times) {
  moe_forward(ep, comm::Comm{}, c, w, s, x, tokens, out, sv, o, times);
}

void moe_forward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                 const ChunkSchedule& s, const float* x, int tokens, float* out, MoeSaved& sv, const ExecOptions& o,
                 std::vector<StepTime>* times) {
  check_moe_args(ep, etp, c, w, tokens, s);
  comm::raise_if_any(ep, poll_error(o));
  cpu::LayerOps ops = layer_ops(o, times);
  const MoeCall a{c, s, ep, etp, kNoGroup, tokens};
  const MoeParams p = params_of(c, w);
  sv = MoeSaved{};
  sv.x = x;
  std::vector<float> logits(size_t(tokens) * size_t(c.experts));
  router_logits(ops, a, p, x, logits.data());
  route(ops, a, p, logits.data(), sv);
  plan_chunks(ops, a, sv, true);
  forward(ops, a, p, sv, x, out);
}

void moe_backward(const comm::Comm& ep, const MoeConfig& c, const MoeWeights& w, const ChunkSchedule& s,
                  MoeSaved& sv, const float* dout, float* dx, MoeWeights& g, const ExecOptions& o,
                  std::vector<StepTime>* times) {
  moe_backward(ep, comm::Comm{}, c, w, s, sv, dout, dx, g, o, times);
}

void moe_backward(const comm::Comm& ep, const comm::Comm& etp, const MoeConfig& c, const MoeWeights& w,
                  const ChunkSchedule& s, MoeSaved& sv, const float* dout, float* dx, MoeWeights& g,
                  const ExecOptions& o, std::vector<StepTime>* times) {
  comm::raise_if_any(ep, poll_error(o));  // collective, so a rank with a bad option cannot strand the others
  cpu::LayerOps ops = layer_ops(o, times);
  const MoeCall a{c, s, ep, etp, kNoGroup, sv.tokens};
  g = zeros_like(w);
  backward(ops, a, params_of(c, w), grads_of(g), sv, sv.x, dout, dx);
}

void restore_routing(const MoeConfig& c, const MoeWeights& w, int ep_size, int etp_size, const ChunkSchedule& s,
                     MoeSaved& sv) {
  comm::Comm ep, etp;  // their sizes and this rank's place only: no collective runs without the exchange
  ep.size = ep_size;
  ep.rank = w.local_experts > 0 ? w.first_expert / w.local_experts : 0;
  etp.size = etp_size;
  cpu::LayerOps ops;
  plan_chunks(ops, MoeCall{c, s, ep, etp, kNoGroup, sv.tokens}, sv, false);
}

}  // namespace lcplan::moe
