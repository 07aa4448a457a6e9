#include "common/progress.h"

#include <algorithm>
#include <cmath>

#include <unistd.h>

namespace lcplan {

namespace {

// 829440 -> "829,440": counts of millions of plans are read at a glance with separators.
std::string grouped(double v) {
  const long long n = std::llround(std::max(0.0, v));
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string duration_text(double seconds) {
  char buf[64];
  if (!std::isfinite(seconds) || seconds < 0) return "unknown";
  if (seconds < 10) std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  else if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0f s", seconds);
  else if (seconds < 3600) {
    const long long s = std::llround(seconds);
    std::snprintf(buf, sizeof buf, "%lld min %02lld s", s / 60, s % 60);
  } else {
    const long long m = std::llround(seconds / 60);
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", m / 60, m % 60);
  }
  return buf;
}

std::string progress_line(const ProgressState& s, const std::string& label, const std::string& unit) {
  std::string line = label + ": " + grouped(double(s.done)) + " / " + grouped(double(s.total)) + " " + unit;
  if (s.total > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.0f%%)", std::floor(100.0 * double(s.done) / double(s.total)));
    line += pct;
  }
  if (s.has_best) {
    char best[96];
    std::snprintf(best, sizeof best, ", best %s tok/s/GPU %.1f TFLOP/s", grouped(s.best_tokens_per_second_per_gpu).c_str(),
                  s.best_tflops_per_gpu);
    line += best;
  } else {
    line += ", nothing fits yet";
  }
  if (s.done == 0 || s.total == 0) line += ", time left unknown";
  else if (s.done >= s.total) line += ", done";
  else line += ", about " + duration_text(s.elapsed_seconds * double(s.total - s.done) / double(s.done)) + " left";
  return line;
}

TerminalProgress::TerminalProgress(std::FILE* out, std::string label, std::string unit, double delay_seconds,
                                   double interval_seconds)
    : out_(out),
      label_(std::move(label)),
      unit_(std::move(unit)),
      delay_(delay_seconds),
      interval_(interval_seconds),
      tty_(out != nullptr && ::isatty(::fileno(out)) == 1) {}

TerminalProgress::~TerminalProgress() {
  // Erase the line so that the result (or an error sentence) starts on a clean line.
  if (shown_) {
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
  }
}

void TerminalProgress::update(ProgressState s) {
  if (!tty_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (t < delay_ || t - last_shown_ < interval_) return;
  s.elapsed_seconds = t;
  // \033[K clears what a longer earlier line left to the right.
  std::fprintf(out_, "\r%s\033[K", progress_line(s, label_, unit_).c_str());
  std::fflush(out_);
  shown_ = true;
  last_shown_ = t;
}

}  // namespace lcplan
