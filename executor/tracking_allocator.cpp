#include "executor/tracking_allocator.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lcplan::exec {

double Snapshot::total() const {
  double t = 0;
  for (double b : bytes) t += b;
  return t;
}

MemoryBreakdown Snapshot::to_breakdown() const {
  MemoryBreakdown b;
  for (int c = 0; c < kCategories; ++c) b.*kMemoryCategories[c].member = bytes[c];
  return b;
}

void Tracker::set_phase(Phase p) {
  phase_ = static_cast<int>(p);
  peaks_[phase_].seen = true;
  record();
}

void Tracker::add(Category c, double bytes) {
  ++ops_;
  double& v = live_[static_cast<int>(c)];
  v += bytes;
  if (c == Category::Workspace) ws_high_ = std::max(ws_high_, v);
  record();
}

void Tracker::sub(Category c, double bytes) {
  ++ops_;
  double& v = live_[static_cast<int>(c)];
  if (v - bytes < -0.5) throw std::logic_error(std::string("tracker: more bytes released than charged to ") + category_key(c));
  v -= bytes;
}

double Tracker::live_total() const {
  double t = 0;
  for (double b : live_) t += b;
  return t;
}

Snapshot Tracker::now() const {
  Snapshot s;
  s.bytes = live_;
  s.bytes[int(Category::Workspace)] = std::max(reserve_, ws_high_);  // a reservation, like a GPU workspace
  return s;
}

// Only additions can raise a total, so the peak is checked on add (and when a phase starts).
void Tracker::record() {
  if (phase_ < 0) return;
  PhasePeak& pk = peaks_[phase_];
  const Snapshot s = now();
  if (s.total() > pk.at_peak.total()) pk.at_peak = s;
  for (int c = 0; c < kCategories; ++c) pk.category_max.bytes[c] = std::max(pk.category_max.bytes[c], s.bytes[c]);
}

std::pair<Phase, Snapshot> Tracker::overall_peak() const {
  int best = 0;
  for (int p = 1; p < kPhases; ++p)
    if (peaks_[p].at_peak.total() > peaks_[best].at_peak.total()) best = p;
  return {static_cast<Phase>(best), peaks_[best].at_peak};
}

void retain_freed_host_memory() {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  // Serve every size from the heap (no per-allocation mmap), else up to 32 MiB (older glibc's largest threshold on
  // 64-bit, man mallopt), and never trim the heap's top back to the kernel. A fixed trim threshold alone would also
  // freeze the mmap threshold at its 128 KiB default (slower than glibc's dynamic one), so it follows a success only.
  if (mallopt(M_MMAP_THRESHOLD, INT_MAX) == 0 && mallopt(M_MMAP_THRESHOLD, 32 << 20) == 0) return;
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

}  // namespace lcplan::exec
