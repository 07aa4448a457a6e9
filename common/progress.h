// Progress of a long loop (a search, a tune loop) on a terminal: one line on stderr, rewritten in place with '\r'
// and erased at the end, shown only when stderr is a terminal and the loop has run longer than a second.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace lcplan {

struct ProgressState {
  size_t done = 0, total = 0;
  double elapsed_seconds = 0;
  bool has_best = false;  // a plan that fits has been found
  double best_tokens_per_second_per_gpu = 0, best_tflops_per_gpu = 0;
};

// "1.5 s", "42 s", "3 min 05 s", "2 h 07 min": coarse on purpose, the estimate is only a linear extrapolation.
std::string duration_text(double seconds);

// The line without '\r', e.g. "searching: 412,672 / 829,440 plans (50%), best 1,234 tok/s/GPU 210.3 TFLOP/s,
// about 1.2 s left". Time left extrapolates the elapsed time linearly over what remains.
std::string progress_line(const ProgressState& s, const std::string& label = "searching", const std::string& unit = "plans");

// Writes progress_line to `out` when `out` is a terminal, at most every `interval` seconds once `delay` seconds have
// passed, and erases it on destruction; writes nothing at all otherwise. Not thread-safe (one loop, one line).
class TerminalProgress {
 public:
  explicit TerminalProgress(std::FILE* out = stderr, std::string label = "searching", std::string unit = "plans",
                            double delay_seconds = 1.0, double interval_seconds = 0.1);
  ~TerminalProgress();
  TerminalProgress(const TerminalProgress&) = delete;
  TerminalProgress& operator=(const TerminalProgress&) = delete;

  // `s.elapsed_seconds` is ignored: the elapsed time is measured from construction.
  void update(ProgressState s);
  bool is_terminal() const { return tty_; }

 private:
  std::FILE* out_;
  std::string label_, unit_;
  double delay_, interval_;
  bool tty_;
  bool shown_ = false;
  double last_shown_ = -1e300;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace lcplan
