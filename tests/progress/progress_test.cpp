// The progress line: its wording from counts and times, silence on a non-terminal, the line rewritten in place and
// erased on a terminal (a pseudo-terminal here), and the search's callback carrying the best plan so far.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "common/data_dir.h"
#include "common/progress.h"
#include "models/zoo.h"
#include "search/search.h"

using namespace lcplan;

namespace {

TEST(ProgressLine, WordsCountsBestAndTimeLeft) {
  ProgressState s{412672, 829440, 1.0, true, 1234.4, 210.34};
  EXPECT_EQ(progress_line(s), "searching: 412,672 / 829,440 plans (49%), best 1,234 tok/s/GPU 210.3 TFLOP/s, about 1.0 s left");
  s.has_best = false;
  s.elapsed_seconds = 30;
  EXPECT_EQ(progress_line(s, "tuning", "runs"), "tuning: 412,672 / 829,440 runs (49%), nothing fits yet, about 30 s left");
  EXPECT_EQ(progress_line({0, 10, 5, false, 0, 0}), "searching: 0 / 10 plans (0%), nothing fits yet, time left unknown");
  EXPECT_EQ(progress_line({10, 10, 5, true, 99.6, 1.25}), "searching: 10 / 10 plans (100%), best 100 tok/s/GPU 1.2 TFLOP/s, done");
}

TEST(ProgressLine, DurationsAreCoarse) {
  EXPECT_EQ(duration_text(0.04), "0.0 s");
  EXPECT_EQ(duration_text(9.94), "9.9 s");
  EXPECT_EQ(duration_text(42.4), "42 s");
  EXPECT_EQ(duration_text(185), "3 min 05 s");
  EXPECT_EQ(duration_text(7620), "2 h 07 min");
  EXPECT_EQ(duration_text(-1), "unknown");
}

TEST(TerminalProgress, WritesNothingWhenTheStreamIsNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    TerminalProgress p(f, "searching", "plans", /*delay_seconds=*/0, /*interval_seconds=*/0);
    EXPECT_FALSE(p.is_terminal());
    p.update({1, 2, 0, true, 10, 1});
  }
  EXPECT_EQ(std::ftell(f), 0L);
  std::fclose(f);
}

// Reads what is waiting on the pseudo-terminal's master side.
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 200) > 0) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

TEST(TerminalProgress, RewritesOneLineInPlaceAndErasesIt) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) GTEST_SKIP() << "no pseudo-terminal available";
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  std::FILE* tty = ::fdopen(slave, "w");
  ASSERT_NE(tty, nullptr);
  {
    TerminalProgress p(tty, "searching", "plans", 0, 0);
    EXPECT_TRUE(p.is_terminal());
    p.update({5, 10, 0, false, 0, 0});
    p.update({10, 10, 0, true, 1500, 300});
    const std::string shown = drain(master);
    EXPECT_EQ(shown.rfind("\rsearching: 5 / 10 plans (50%), nothing fits yet, about ", 0), 0u) << shown;
    EXPECT_NE(shown.find("\rsearching: 10 / 10 plans (100%), best 1,500 tok/s/GPU 300.0 TFLOP/s, done\033[K"), std::string::npos)
        << shown;
    EXPECT_EQ(shown.find('\n'), std::string::npos) << "the line must be rewritten, not scrolled";
  }
  EXPECT_EQ(drain(master), "\r\033[K") << "the line is erased at the end";
  std::fclose(tty);
  ::close(master);
}

TEST(TerminalProgress, StaysQuietDuringTheFirstSecond) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) GTEST_SKIP() << "no pseudo-terminal available";
  std::FILE* tty = ::fdopen(::open(::ptsname(master), O_RDWR | O_NOCTTY), "w");
  ASSERT_NE(tty, nullptr);
  {
    TerminalProgress p(tty);  // default: nothing before a second has passed
    p.update({1, 10, 0, false, 0, 0});
  }
  EXPECT_EQ(drain(master), "") << "a short loop leaves no trace, not even an erase";
  std::fclose(tty);
  ::close(master);
}

TEST(SearchProgress, CallbackSeesCountsAndTheBestSoFar) {
  const std::string dir = data_dir();
  const ModelSpec m = load_model("qwen3.5-35b-a3b", dir);
  const Hardware hw = load_hardware("h100-sxm-80gb", dir);
  const Calibration cal = calibration_for(load_calibration("default", dir), "h100-sxm-80gb", "bumblebee");
  Plan base;
  base.model = "qwen3.5-35b-a3b";
  base.gpus = 32;
  base.gpus_per_node = 8;
  base.seq_len = 131072;
  base.global_batch = 32;
  base.implementation = "bumblebee";
  SearchOptions opt;
  opt.headroom_bytes = 4.0 * (1 << 30);
  const PlanSpace space = default_space(m, base);
  size_t calls = 0, last_done = 0;
  double last_best = 0;
  bool monotone = true;
  SearchProgress final_state;
  const SearchResult r = search_plans(m, base, space, hw, cal, opt, [&](const SearchProgress& s) {
    ++calls;
    monotone = monotone && s.done >= last_done && s.done <= s.total && (!s.has_best || s.best_tokens_per_second_per_gpu >= last_best);
    last_done = s.done;
    if (s.has_best) last_best = s.best_tokens_per_second_per_gpu;
    final_state = s;
  });
  EXPECT_GT(calls, 10u);
  EXPECT_TRUE(monotone) << "counts went backwards or the best got worse";
  EXPECT_EQ(final_state.done, final_state.total);
  EXPECT_EQ(final_state.total, space.size());
  EXPECT_EQ(final_state.feasible, r.feasible);
  ASSERT_TRUE(final_state.has_best);
  EXPECT_EQ(final_state.best_tokens_per_second_per_gpu, r.top.front().estimate.time.tokens_per_second_per_gpu);
  EXPECT_EQ(final_state.best_tflops_per_gpu, r.top.front().estimate.time.tflops_per_gpu);

  // A callback of the earlier form (done, total) still works.
  size_t old_calls = 0, old_total = 0;
  search_plans(m, base, space, hw, cal, opt, [&](size_t, size_t total) {
    ++old_calls;
    old_total = total;
  });
  EXPECT_EQ(old_calls, calls);
  EXPECT_EQ(old_total, space.size());
  // An empty callback of either form is no callback.
  EXPECT_FALSE(bool(Progress(std::function<void(size_t, size_t)>())));
  EXPECT_FALSE(bool(Progress(std::function<void(const SearchProgress&)>())));
  EXPECT_FALSE(bool(Progress()));
  EXPECT_TRUE(bool(Progress([](size_t, size_t) {})));
}

}  // namespace
