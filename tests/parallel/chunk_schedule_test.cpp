// The chunked EP schedule as data: orders, dependencies, token bounds and the two-stream simulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "parallel/chunk_schedule.h"

namespace lcplan::moe {
namespace {

std::vector<std::string> order(const std::vector<Step>& steps, StreamKind k) {
  std::vector<std::string> out;
  for (const Step& s : steps)
    if (s.stream == k) out.push_back(step_label(s));
  return out;
}

int find(const std::vector<Step>& steps, StepOp op, int chunk) {
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].op == op && steps[i].chunk == chunk) return static_cast<int>(i);
  return -1;
}

TEST(ChunkSchedule, ForwardOrderIsTheArticles) {
  const ChunkSchedule s = make_chunk_schedule(2);
  EXPECT_EQ(order(s.forward, StreamKind::Comm),
            (std::vector<std::string>{"counts", "c0 dispatch", "c1 dispatch", "c0 combine", "c1 combine"}));
  const auto compute = order(s.forward, StreamKind::Compute);
  const auto g0 = std::find(compute.begin(), compute.end(), "c0 expert GEMM");
  ASSERT_NE(g0, compute.end());
  EXPECT_EQ(*(g0 + 1), "c1 expert GEMM");
  // c_i dispatch -> c_i GEMM -> c_i combine
  for (int c = 0; c < 2; ++c) {
    const Step& g = s.forward[find(s.forward, StepOp::ExpertFwd, c)];
    EXPECT_EQ(g.deps, std::vector<int>{find(s.forward, StepOp::Dispatch, c)});
    const Step& x = s.forward[find(s.forward, StepOp::Combine, c)];
    EXPECT_EQ(x.deps, std::vector<int>{find(s.forward, StepOp::ExpertFwd, c)});
  }
}

TEST(ChunkSchedule, BackwardDelaysWgradAfterTheLastDgrad) {
  for (int n = 1; n <= 4; ++n) {
    const ChunkSchedule s = make_chunk_schedule(n);
    const auto comm = order(s.backward, StreamKind::Comm);
    ASSERT_EQ(comm.size(), size_t(2 * n));
    auto label = [](int c, const char* what) {  // appended piece by piece: GCC 12 misreads "c" + string as overlap
      std::string l = "c";
      l += std::to_string(c);
      l += ' ';
      return l += what;
    };
    for (int c = 0; c < n; ++c) {
      EXPECT_EQ(comm[c], label(c, "combine-bwd"));
      EXPECT_EQ(comm[n + c], label(c, "dispatch-bwd"));
    }
    const int wgrad = find(s.backward, StepOp::ExpertWgrad, -1);
    ASSERT_GE(wgrad, 0);
    for (int c = 0; c < n; ++c) EXPECT_LT(find(s.backward, StepOp::ExpertDgrad, c), wgrad);
    // Unit durations: the delayed wgrad runs while the last chunk's dispatch-bwd is in flight.
    const Timeline t = simulate(s.backward, std::vector<double>(s.backward.size(), 1.0));
    const int tail = find(s.backward, StepOp::DispatchBwd, n - 1);
    EXPECT_LT(t.start[wgrad], t.end[tail]);
    EXPECT_GT(t.end[wgrad], t.start[tail]);
  }
}

TEST(ChunkSchedule, ChunkingHidesCommunicationInTheSimulation) {
  // Costed by simulate(): comm and GEMM per chunk scale with the chunk's share.
  auto makespan = [](int n) {
    const ChunkSchedule s = make_chunk_schedule(n, {}, false);
    std::vector<double> d(s.forward.size(), 0.0);
    for (size_t i = 0; i < d.size(); ++i) {
      const StepOp op = s.forward[i].op;
      if (op == StepOp::Dispatch || op == StepOp::Combine) d[i] = 1.0 / n;
      if (op == StepOp::ExpertFwd) d[i] = 2.0 / n;
    }
    return simulate(s.forward, d).makespan;
  };
  EXPECT_DOUBLE_EQ(makespan(1), 4.0);         // dispatch, GEMM, combine in series
  EXPECT_DOUBLE_EQ(makespan(2), 0.5 + 2 + 0.5);  // c1 dispatch under c0 GEMM, c0 combine under c1 GEMM
  EXPECT_LT(makespan(4), makespan(2));
}

TEST(ChunkSchedule, BoundsFollowWeightsAndKeepEveryChunkNonEmpty) {
  EXPECT_EQ(chunk_bounds(10, 1), (std::vector<int>{0, 10}));
  EXPECT_EQ(chunk_bounds(10, 2), (std::vector<int>{0, 5, 10}));
  EXPECT_EQ(chunk_bounds(10, 3), (std::vector<int>{0, 3, 7, 10}));
  EXPECT_EQ(chunk_bounds(100, 2, {3, 1}), (std::vector<int>{0, 75, 100}));
  EXPECT_EQ(chunk_bounds(3, 2, {0.99, 0.01}), (std::vector<int>{0, 2, 3}));  // the small chunk keeps one token
  EXPECT_EQ(chunk_bounds(4, 4), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ChunkSchedule, BadArgumentsNameTheValue) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([] { chunk_bounds(3, 4); }).find("ep_chunks = 4 is more than the 3 local tokens"), std::string::npos);
  EXPECT_NE(msg([] { make_chunk_schedule(5); }).find("ep_chunks = 5"), std::string::npos);
  EXPECT_NE(msg([] { make_chunk_schedule(0); }).find("ep_chunks = 0"), std::string::npos);
  EXPECT_NE(msg([] { make_chunk_schedule(2, {1, 2, 3}); }).find("3 values"), std::string::npos);
  EXPECT_NE(msg([] { make_chunk_schedule(2, {1, -1}); }).find("not a positive number"), std::string::npos);
}

TEST(ChunkSchedule, DeadlockAndDanglingDependenciesAreRejected) {
  // Comm step 0 waits on compute step 2, which is queued behind compute step 1 that waits on comm step 0... fine;
  // here compute step 1 waits on comm step 3, queued behind comm step 0 which waits on compute step 2.
  std::vector<Step> bad = {{StreamKind::Comm, StepOp::Dispatch, 0, {2}},
                           {StreamKind::Compute, StepOp::ExpertFwd, 0, {3}},
                           {StreamKind::Compute, StepOp::Permute, 0, {}},
                           {StreamKind::Comm, StepOp::Combine, 0, {}}};
  EXPECT_THROW(validate_steps(bad), std::logic_error);
  std::vector<Step> dangling = {{StreamKind::Comm, StepOp::Dispatch, 0, {7}}};
  EXPECT_THROW(validate_steps(dangling), std::logic_error);
}

TEST(ChunkSchedule, PrintsBothStreams) {
  const std::string text = format_schedule(make_chunk_schedule(2, {0.6, 0.4}));
  EXPECT_NE(text.find("comm order: counts, c0 dispatch, c1 dispatch, c0 combine, c1 combine"), std::string::npos)
      << text;
  EXPECT_NE(text.find("expert wgrad (delayed)"), std::string::npos);
  EXPECT_NE(text.find("token shares 0.600/0.400"), std::string::npos) << text;
}

}  // namespace
}  // namespace lcplan::moe
