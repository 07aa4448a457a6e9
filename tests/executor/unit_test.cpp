// lcplan-exec pieces that need no MPI: the scale rules, the parameter layout against the estimator's counts, the
// measurement record with the executor's detail, the tracking allocator, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "calibrate/measurement.h"
#include "common/user_error.h"
#include "estimator/derived_plan.h"
#include "estimator/plan_rules.h"
#include "executor/exec_model.h"
#include "executor/param_store.h"
#include "executor/schedule.h"
#include "executor/scale.h"
#include "executor/tracking_allocator.h"
#include "models/params.h"
#include "tests/executor/exec_util.h"

namespace lcplan::exec::tests {
namespace {

Plan plan_of(const std::string& model, int gpus, int cp, int ep, int64_t seq = 131072) {
  PlanArgs a;
  a.gpus = gpus;
  a.cp = cp;
  a.ep = ep;
  a.seq = seq;
  return make_plan(model, a);
}

TEST(Scale, QwenKeepsDivisibilityAndTheLayerMix) {
  const ModelSpec m = zoo("qwen3.5-35b-a3b");
  const ScaledCase sc = executor_case(m, plan_of("qwen3.5-35b-a3b", 32, 4, 8), {16, 0});
  const ModelSpec& s = sc.model;
  EXPECT_EQ(s.hidden, 128);
  EXPECT_EQ(s.vocab, 248320 / 16);
  EXPECT_EQ(s.attn.heads * s.attn.head_dim, 16 * 256 / 16);        // q width divided by K
  EXPECT_EQ(s.attn.kv_heads * s.attn.head_dim, 2 * 256 / 16);      // kv width divided by K
  EXPECT_EQ(s.linear.key_heads % 4, 0);                             // head-parallel CP of linear attention
  EXPECT_EQ(s.linear.key_heads * s.linear.key_head_dim, 16 * 128 / 16);
  EXPECT_EQ(s.linear.value_heads * s.linear.value_head_dim, 32 * 128 / 16);
  EXPECT_EQ(s.moe.num_experts, 16);                                 // 256 / 16, a multiple of ep = 8
  EXPECT_EQ(s.moe.top_k, 8);
  EXPECT_EQ(s.moe.expert_ffn, 32);
  EXPECT_EQ(s.layers.size(), m.layers.size());                      // every layer: the mix is kept
  EXPECT_EQ(s.mtp_layers, 0);
  EXPECT_EQ(sc.mtp_dropped, 1);
  EXPECT_EQ(sc.plan.seq_len, 131072 / 16);
  EXPECT_EQ(sc.plan.seq_len % (2 * 4), 0);
  EXPECT_NO_THROW(require_valid_plan(s, sc.plan));
}

TEST(Scale, LayersPerKindKeepsModelOrder) {
  const ModelSpec m = zoo("qwen3.5-35b-a3b");
  Plan p = plan_of("qwen3.5-35b-a3b", 4, 2, 4);
  p.recompute = Recompute::Full;
  p.recompute_layers = 3;
  const ScaledCase sc = executor_case(m, p, {64, 2});
  ASSERT_EQ(sc.kept_layers, (std::vector<int>{0, 1, 3, 7}));  // linear 0, 1 and full attention 3, 7
  EXPECT_EQ(sc.model.layers[0].mixer, MixerKind::LinearAttention);
  EXPECT_EQ(sc.model.layers[2].mixer, MixerKind::FullAttention);
  EXPECT_EQ(sc.plan.recompute_layers, 3);
  const ScaledCase one = executor_case(m, p, {64, 1});
  EXPECT_EQ(one.plan.recompute_layers, 2);  // clamped to the two kept layers
  EXPECT_NO_THROW(require_valid_plan(one.model, one.plan));
}

TEST(Scale, FactorOneOnlyDropsMtp) {
  const ModelSpec m = zoo("qwen3.5-35b-a3b");
  const ScaledCase sc = executor_case(m, plan_of("qwen3.5-35b-a3b", 32, 4, 8), {1, 0});
  EXPECT_EQ(sc.model.hidden, m.hidden);
  EXPECT_EQ(sc.model.moe.num_experts, m.moe.num_experts);
  EXPECT_EQ(sc.plan.seq_len, 131072);
  EXPECT_EQ(count_params(sc.model).total, count_params(m).total);
  EXPECT_EQ(sc.model.mtp_layers, 0);
}

TEST(Scale, BadOptionsAreOneSentence) {
  EXPECT_THROW(check_scale_options({0, 0}), UserError);
  EXPECT_THROW(check_scale_options({2, -1}), UserError);
}

// Units hold exactly the parameters the estimator counts: the model total, and each layer's dense / routed split
// (routed experts divided over ep) as models/params.cpp has them.
TEST(ExecModel, UnitsMatchTheEstimatorsCounts) {
  for (const char* name : {"qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b",
                           "deepseek-v3", "moonlight-16b-a3b", "glm-4.5"}) {
    const ModelSpec full = zoo(name);
    ASSERT_EQ(executor_support_error(full, plan_of(name, 4, 1, 1)), "") << name;
    const int ep = full.moe.num_experts > 0 ? 4 : 1;
    const ScaledCase sc = executor_case(full, plan_of(name, 4, 1, ep), {32, 1});
    const ModelSpec& m = sc.model;
    const Dims d = make_dims(m);
    const std::vector<UnitLayout> units = model_units(m, d, {0, ep});
    double total = 0;
    for (const UnitLayout& u : units) {
      total += double(u.n_dense) + double(u.n_expert) * ep;
      size_t dense = 0, expert = 0;
      for (const TensorSpec& t : u.tensors) (t.expert ? expert : dense) += t.size;
      EXPECT_EQ(dense, u.n_dense) << name << " " << u.name;
      EXPECT_EQ(expert, u.n_expert) << name << " " << u.name;
      if (u.kind == UnitKind::Layer) {
        const LayerParams lp = layer_params(m, m.layers[u.layer]);
        EXPECT_EQ(double(u.n_dense), lp.total() - lp.routed_experts) << name << " " << u.name;
        EXPECT_EQ(double(u.n_expert) * ep, lp.routed_experts) << name << " " << u.name;
      }
    }
    EXPECT_EQ(total, count_params(m).total) << name;
  }
}

TEST(Record, DetailRoundTripsAndBadFieldsAreNamed) {
  Measurement m;
  m.id = "x";
  m.plan = plan_of("qwen3.5-35b-a3b", 4, 2, 4);
  m.peak_bytes = 100;
  m.step_seconds = 2;
  MemoryBreakdown b;
  b.params = 1;
  b.moe_buffers = 7;
  m.breakdown = b;
  m.peak_phase = Phase::Backward;
  m.peak_rank = 3;
  m.phases[2] = MeasuredPhase{100.0, b, b, 0.5};
  m.ranks.push_back({3, 100.0, Phase::Backward, 12.0});
  m.scale = MeasuredScale{64, 1, 1, {0, 3}, nlohmann::json{{"hidden", 32}}};
  m.steps = 2;
  m.loss = 8.5;
  m.grad_norm = 0.7;
  m.per_step.push_back({8.5, 0.7, 2.0});
  m.backend = "cpu";
  m.device = "cpu";
  m.host = "h";
  m.executor = {{"workspace_reserve_bytes", 1}};
  m.notes = "n";
  const nlohmann::json j = measurement_to_json(m);
  const Measurement r = measurement_from_json(j, "rec");
  EXPECT_EQ(measurement_to_json(r), j);
  EXPECT_EQ(r.breakdown->moe_buffers, 7);
  EXPECT_EQ(*r.phases[2]->seconds, 0.5);
  EXPECT_EQ(r.scale->kept_layers, (std::vector<int>{0, 3}));
  auto error_of = [](nlohmann::json x) -> std::string {
    try {
      measurement_from_json(x, "rec");
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json bad = j;
  bad["breakdown"]["activation"] = 1;
  EXPECT_NE(error_of(bad).find("\"activation\""), std::string::npos);
  bad = j;
  bad["peak_phase"] = "warmup";
  EXPECT_NE(error_of(bad).find("\"warmup\""), std::string::npos);
  bad = j;
  bad["phases"]["backward"]["seconds"] = -1;
  EXPECT_NE(error_of(bad).find("non-negative"), std::string::npos);
  bad = j;
  bad["scale"]["factor"] = 0;
  EXPECT_NE(error_of(bad).find("factor"), std::string::npos);
  bad = j;
  bad["ranks"][0].erase("rank");
  EXPECT_NE(error_of(bad).find("\"rank\""), std::string::npos);
}

TEST(Tracker, PhasePeaksBreakdownsAndTheWorkspaceReservation) {
  Tracker t(100);
  t.add(Category::Params, 10);  // outside a phase: no peak
  t.set_phase(Phase::Forward);
  EXPECT_EQ(t.peak(Phase::Forward).at_peak.total(), 110);  // the reservation counts from the start
  t.add(Category::Activations, 50);
  t.add(Category::Workspace, 30);  // inside the reservation: workspace still reads 100
  EXPECT_EQ(t.now().bytes[int(Category::Workspace)], 100);
  t.sub(Category::Workspace, 30);
  t.set_phase(Phase::Backward);
  t.add(Category::MoeBuffers, 5);
  t.sub(Category::Activations, 50);
  t.add(Category::Workspace, 150);  // outgrows it: the category reads the high-water from now on
  EXPECT_EQ(t.now().bytes[int(Category::Workspace)], 150);
  t.sub(Category::Workspace, 150);
  EXPECT_EQ(t.now().bytes[int(Category::Workspace)], 150);
  EXPECT_EQ(t.workspace_high_water(), 150);
  const PhasePeak& f = t.peak(Phase::Forward);
  EXPECT_EQ(f.at_peak.total(), 160);
  const PhasePeak& b = t.peak(Phase::Backward);
  EXPECT_EQ(b.at_peak.total(), 165);
  EXPECT_EQ(b.category_max.bytes[int(Category::Activations)], 50);  // its own largest value in the phase
  EXPECT_EQ(t.overall_peak().first, Phase::Backward);
  EXPECT_THROW(t.sub(Category::Grads, 1), std::logic_error);
  {
    Buf<float> x(t, Category::Grads, 4);
    EXPECT_EQ(t.live(Category::Grads), 16);
  }
  EXPECT_EQ(t.live(Category::Grads), 0);
}

TEST(Refusals, OneSentenceNamingTheValue) {
  const ModelSpec llama = zoo("llama-3.1-8b");
  Plan p = plan_of("llama-3.1-8b", 4, 1, 1);
  p.parallel.pp = 2;
  p.parallel.tp = 2;
  EXPECT_EQ(executor_support_error(llama, p), "");  // pipeline and tensor parallel plans run
  p.sequence_parallel = false;
  EXPECT_NE(executor_support_error(llama, p).find("sequence_parallel = false"), std::string::npos);
  p.sequence_parallel = true;
  ModelSpec odd = llama;
  odd.vocab = 1001;
  EXPECT_NE(executor_support_error(odd, p).find("vocabulary of 1001"), std::string::npos);
  // Interleaving with 2 microbatches per step on pp = 4: Megatron's schedule needs a multiple of pp.
  Plan v = plan_of("llama-3.1-8b", 4, 1, 1);
  v.parallel.pp = 4;
  v.parallel.vpp = 2;
  v.global_batch = 2;
  EXPECT_NE(executor_support_error(llama, v).find("multiple of its group of 4 (pp)"), std::string::npos);
  v.global_batch = 8;
  EXPECT_EQ(executor_support_error(llama, v), "");
  p = plan_of("llama-3.1-8b", 4, 1, 1);
  p.precision = Precision::FP8;
  EXPECT_NE(executor_support_error(llama, p).find("fp8"), std::string::npos);
  EXPECT_EQ(executor_support_error(zoo("deepseek-v3"), plan_of("deepseek-v3", 4, 1, 4)), "");  // MLA runs
  EXPECT_NE(executor_support_error(zoo("gpt-oss-120b"), plan_of("gpt-oss-120b", 4, 1, 4)).find("gpt-oss"),
            std::string::npos);
  ModelSpec latent = zoo("deepseek-v3");
  latent.moe.latent = 1024;
  EXPECT_NE(executor_support_error(latent, plan_of("deepseek-v3", 4, 1, 4)).find("latent MoE (latent width 1024)"),
            std::string::npos);
}

// The schedule lcplan-exec runs holds, at the start of each stage's first backward, exactly the in-flight
// microbatches the estimator assumes per virtual chunk (estimator/derived_plan.cpp inflight), for 1F1B and the
// interleaved schedule with its default group of pp microbatches and larger ones (Plan::microbatch_group, up to
// breadth-first: all M); and every stage's list completes against the others (no wait forever).
TEST(Schedule, InFlightMicrobatchesAreTheEstimators) {
  const ModelSpec base = zoo("llama-3.1-8b");
  const Hardware hw = h100();
  int checked = 0, grouped = 0;
  for (int pp : {1, 2, 3, 4, 8})
    for (int vpp : {1, 2, 3})
      for (int mult : {1, 2, 3, 4})
        for (int gmult : {0, 1, 2, 4}) {
          if ((vpp > 1 && pp == 1) || (gmult > 0 && (vpp == 1 || mult % gmult != 0))) continue;
          const int M = pp * mult, group = gmult * pp;
          ModelSpec m = base;
          m.layers.resize(size_t(pp * vpp * 2));
          Plan p = plan_of("llama-3.1-8b", pp, 1, 1, 8192);
          p.parallel.pp = pp;
          p.parallel.vpp = vpp;
          p.global_batch = M;
          p.microbatch_group = group;
          ASSERT_EQ(check_plan(m, p), std::nullopt);
          ASSERT_EQ(executor_support_error(m, p), "");
          const DerivedPlan d = derive_plan(m, p, hw);
          ASSERT_EQ(simulate_pipeline(pp, vpp, M, nullptr, group), "") << pp << " " << vpp << " " << M << " " << group;
          for (int r = 0; r < pp; ++r) {
            const std::vector<int> held = held_at_first_backward(pp, vpp, r, M, group);
            for (const LayerRecord& l : d.layers)
              if (l.stage == r) {
                EXPECT_EQ(double(held[size_t(l.vchunk)]), l.inflight)
                    << "pp " << pp << " vpp " << vpp << " M " << M << " group " << group << " stage " << r
                    << " chunk " << l.vchunk;
                ++checked;
                grouped += group > pp;
              }
          }
        }
  EXPECT_GT(checked, 500);
  EXPECT_GT(grouped, 100);
  // A larger group holds more: breadth-first (group = M) on 4 stages, 2 chunks, 8 microbatches holds 8 + 7 on the
  // first stage at its first backward (2 x 3 + 8 warmup forwards plus one), depth-first 7 + 4.
  EXPECT_EQ(held_at_first_backward(4, 2, 0, 8, 8), (std::vector<int>{8, 7}));
  EXPECT_EQ(held_at_first_backward(4, 2, 0, 8), (std::vector<int>{7, 4}));
  // 1F1B completes for every microbatch count; the interleaved order waits forever on a partial last group.
  for (int M = 1; M <= 9; ++M) EXPECT_EQ(simulate_pipeline(4, 1, M), "") << M;
  EXPECT_NE(simulate_pipeline(4, 3, 5), "");
  // Megatron's 1F1B order on the first of 4 stages with 6 microbatches: 3 warmup forwards, then F B pairs.
  const std::vector<PipeAction> a = pipeline_schedule(4, 1, 0, 6);
  std::string order;
  for (const PipeAction& x : a) order += (x.forward ? "F" : "B") + std::to_string(x.microbatch) + " ";
  EXPECT_EQ(order, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
}

// The GPU backend's stage-to-stage messages (comm::PipeLinks, NCCL without tags): on every link the receiver takes
// the messages in the order the sender sent them, for 1F1B and interleaved orders on every microbatch count the
// schedule runs. With activations and gradients on one communicator per pair, two interleaved stages mix them up
// on a partial last microbatch group (a count lcplan-exec refuses today; the links do not depend on that refusal).
TEST(Schedule, PipelineMessagesArriveInOrderOnEachLink) {
  int checked = 0;
  for (int pp : {1, 2, 3, 4, 8})
    for (int vpp : {1, 2, 3, 4})
      for (int M = 1; M <= 3 * pp + 1; ++M) {
        if (vpp > 1 && (pp == 1 || simulate_pipeline(pp, vpp, M) != "")) continue;  // runs the executor refuses
        ASSERT_EQ(pipeline_message_order_error(pp, vpp, M), "") << pp << " " << vpp << " " << M;
        ++checked;
      }
  EXPECT_GT(checked, 100);
  const std::string mixed = pipeline_message_order_error(2, 2, 5, false);
  EXPECT_NE(mixed.find("where it expects"), std::string::npos) << mixed;
  EXPECT_EQ(pipeline_message_order_error(4, 1, 8, false), "");  // 1F1B over 4 stages: one kind per pair anyway
}

// Each TP / ETP rank's units hold the parameters the estimator counts per rank (derived_plan unit params: the
// TP-split weights / tp plus the replicated vectors, routed experts / (ep * etp)), and the TP shards of one tensor
// are disjoint slices that together cover it.
TEST(ExecModel, TensorParallelShardsMatchTheEstimator) {
  for (const char* name : {"qwen3.5-35b-a3b", "llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "moonlight-16b-a3b",
                           "glm-4.5"}) {
    const ModelSpec full = zoo(name);
    const bool moe = full.moe.num_experts > 0;
    PlanArgs a;
    a.gpus = 8;
    a.tp = 2;
    a.ep = moe ? 2 : 1;
    a.etp = moe ? 2 : 1;
    a.seq = 131072;
    const Plan plan = make_plan(name, a);
    const ScaledCase sc = executor_case(full, plan, {32, 1});
    ASSERT_EQ(check_plan(sc.model, sc.plan), std::nullopt) << name;
    ASSERT_EQ(executor_support_error(sc.model, sc.plan), "") << name;
    const DerivedPlan d = derive_plan(sc.model, sc.plan, h100());
    std::vector<std::vector<size_t>> seen;  // global indices of every tensor element over the TP ranks
    for (int t = 0; t < 2; ++t) {
      const Dims dims = make_dims(sc.model, 2, t, a.etp, t % a.etp);
      const std::vector<UnitLayout> units = model_units(sc.model, dims, {0, a.ep, t % a.etp, a.etp});
      for (const UnitLayout& u : units) {
        if (u.kind != UnitKind::Layer) {
          EXPECT_EQ(double(u.n_dense), u.kind == UnitKind::FinalNorm ? sc.model.hidden
                                                                     : double(sc.model.vocab) * sc.model.hidden / 2)
              << name << " " << u.name;
          continue;
        }
        int kind = -1;
        for (const LayerRecord& r : d.layers)
          if (&r - &d.layers[0] == u.layer) kind = r.kind;
        ASSERT_GE(kind, 0);
        EXPECT_EQ(double(u.n_dense), d.kinds[size_t(kind)].params.dense) << name << " " << u.name;
        EXPECT_EQ(double(u.n_expert), d.kinds[size_t(kind)].params.expert) << name << " " << u.name;
        if (u.layer == 0) {
          if (seen.empty()) seen.resize(u.tensors.size());
          for (size_t k = 0; k < u.tensors.size(); ++k)
            if (!u.tensors[k].tp_replicated && !u.tensors[k].expert)
              for (size_t i = 0; i < u.tensors[k].size; ++i) seen[k].push_back(global_index(u.tensors[k], i));
        }
      }
    }
    const std::vector<UnitLayout> whole = model_units(sc.model, make_dims(sc.model));
    for (size_t k = 0; k < seen.size(); ++k) {
      if (seen[k].empty()) continue;
      std::sort(seen[k].begin(), seen[k].end());
      EXPECT_EQ(std::adjacent_find(seen[k].begin(), seen[k].end()), seen[k].end()) << name << " tensor " << k;
      EXPECT_EQ(seen[k].size(), whole[1].tensors[k].size) << name << " " << whole[1].tensors[k].name;
      EXPECT_EQ(seen[k].back(), whole[1].tensors[k].size - 1) << name << " " << whole[1].tensors[k].name;
    }
  }
}

// The scale rules keep every TP split whole: heads and KV heads (and gated DeltaNet key heads times cp) divisible
// by tp, the vocabulary and the FFN widths by tp, expert FFN widths by etp.
TEST(Scale, TensorParallelDivisibility) {
  int checked = 0;
  for (const char* name : {"qwen3.5-35b-a3b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-next-80b-a3b"})
    for (int tp : {2, 4, 8}) {
      PlanArgs a;
      a.gpus = 8 * tp;
      a.tp = tp;
      a.cp = 2;
      a.seq = 131072;
      const ModelSpec full = zoo(name);
      if (full.moe.num_experts > 0) a.etp = 2;
      if (check_plan(full, make_plan(name, a))) continue;  // tp above the model's KV heads: not a plan to scale
      ++checked;
      const ScaledCase sc = executor_case(full, make_plan(name, a), {64, 1});
      const ModelSpec& m = sc.model;
      EXPECT_EQ(m.attn.heads % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.attn.kv_heads % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.linear.key_heads % (2 * tp), 0) << name << " tp " << tp;
      EXPECT_EQ(m.linear.value_heads % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.vocab % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.dense_ffn % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.moe.shared_ffn % tp, 0) << name << " tp " << tp;
      EXPECT_EQ(m.moe.expert_ffn % 2, 0) << name;
      EXPECT_EQ(sc.plan.seq_len % (2 * 2 * tp), 0) << name;
      EXPECT_EQ(check_plan(m, sc.plan), std::nullopt) << name << " tp " << tp;
    }
  EXPECT_GE(checked, 6);
}

TEST(ParamStore, CountedRangesLeaveOutReplicatedTensorsOffTpRankZero) {
  // A shard holding flat elements [100, 200) of an array whose replicated tensors are [90, 110), [150, 160) and
  // [195, 300): local [10, 50) and [60, 95) are counted off TP rank 0, the whole shard on it.
  const Ranges rep = {{150, 10}, {90, 20}, {195, 105}};  // (offset, size), unsorted
  EXPECT_EQ(counted_ranges(100, 100, rep, true), (Ranges{{10, 50}, {60, 95}}));
  EXPECT_EQ(counted_ranges(100, 100, rep, false), (Ranges{{0, 100}}));
  EXPECT_EQ(counted_ranges(0, 80, rep, true), (Ranges{{0, 80}}));  // no replicated tensor inside
  EXPECT_EQ(counted_ranges(150, 10, rep, true), Ranges{});           // all of it replicated
  EXPECT_EQ(counted_ranges(100, 0, rep, false), Ranges{});           // a padding-only shard
}

}  // namespace
}  // namespace lcplan::exec::tests
