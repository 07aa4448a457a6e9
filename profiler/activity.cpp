#include "profiler/activity.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

namespace lcplan::profiler {

const char* to_string(ActivityKind k) {
  switch (k) {
    case ActivityKind::Kernel: return "kernel";
    case ActivityKind::Memcpy: return "memcpy";
    case ActivityKind::Memset: return "memset";
  }
  return "kernel";
}

std::vector<Interval> Trace::of(uint32_t stream) const {
  for (const StreamIntervals& s : streams)
    if (s.stream == stream) return s.intervals;
  return {};
}

std::vector<Interval> Trace::all() const {
  std::vector<Interval> v;
  for (const StreamIntervals& s : streams) v.insert(v.end(), s.intervals.begin(), s.intervals.end());
  return v;
}

namespace {

// Every record of every buffer on one wrap-safe axis: f(record, start, end) for each timed record, with signed
// nanosecond offsets from `ref`, the first record's start (modulo 2^64, so order survives a wrap of the counter).
// Returns the untimed records (end before start, or CUPTI's 0/0), which are left out.
template <class F>
uint64_t for_each_timed(const std::vector<ActivityBuffer>& buffers, uint64_t& ref, F f) {
  const ActivityRecord* first = nullptr;
  for (const ActivityBuffer& b : buffers)
    if (!first && !b.records.empty()) first = &b.records.front();
  if (!first) return 0;
  ref = first->start;
  uint64_t untimed = 0;
  for (const ActivityBuffer& b : buffers)
    for (const ActivityRecord& r : b.records) {
      const int64_t s = static_cast<int64_t>(r.start - ref), e = static_cast<int64_t>(r.end - ref);
      if (e < s || (r.start == 0 && r.end == 0)) ++untimed;
      else f(r, s, e);
    }
  return untimed;
}

}  // namespace

Trace build_trace(const std::vector<ActivityBuffer>& buffers) {
  Trace t;
  for (const ActivityBuffer& b : buffers) t.dropped += b.dropped;
  struct Placed {
    uint32_t device, stream;
    int64_t start, end;
  };
  std::vector<Placed> placed;
  int64_t lowest = std::numeric_limits<int64_t>::max();
  uint64_t ref = 0;
  t.invalid = for_each_timed(buffers, ref, [&](const ActivityRecord& r, int64_t s, int64_t e) {
    placed.push_back({r.device, r.stream, s, e});
    lowest = std::min(lowest, s);
  });
  if (placed.empty()) return t;
  t.origin = ref + static_cast<uint64_t>(lowest);
  t.records = placed.size();
  std::map<std::pair<uint32_t, uint32_t>, std::vector<Interval>> by_stream;
  for (const Placed& p : placed)
    by_stream[{p.device, p.stream}].push_back({double(p.start - lowest) * 1e-9, double(p.end - lowest) * 1e-9});
  for (auto& [key, iv] : by_stream) {
    std::sort(iv.begin(), iv.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    t.streams.push_back({key.first, key.second, std::move(iv)});
  }
  return t;
}

std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!(i.end > i.start)) continue;
    if (!out.empty() && i.start <= out.back().end) out.back().end = std::max(out.back().end, i.end);
    else out.push_back(i);
  }
  return out;
}

double busy(const std::vector<Interval>& v) {
  double total = 0;
  for (const Interval& i : merge(v)) total += i.end - i.start;
  return total;
}

double both_busy(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  const std::vector<Interval> x = merge(a), y = merge(b);
  double total = 0;
  size_t i = 0, j = 0;
  // Two-pointer sweep over the sorted disjoint unions.
  while (i < x.size() && j < y.size()) {
    const double lo = std::max(x[i].start, y[j].start), hi = std::min(x[i].end, y[j].end);
    if (hi > lo) total += hi - lo;
    (x[i].end < y[j].end) ? ++i : ++j;
  }
  return total;
}

double span(const std::vector<Interval>& v) {
  if (v.empty()) return 0;
  double lo = v.front().start, hi = v.front().end;
  for (const Interval& i : v) lo = std::min(lo, i.start), hi = std::max(hi, i.end);
  return hi - lo;
}

OverlapSummary overlap_summary(const std::vector<Interval>& compute, const std::vector<Interval>& comm) {
  OverlapSummary s;
  s.compute_busy = busy(compute);
  s.comm_busy = busy(comm);
  s.both = both_busy(compute, comm);
  s.union_busy = s.compute_busy + s.comm_busy - s.both;
  std::vector<Interval> all = compute;
  all.insert(all.end(), comm.begin(), comm.end());
  s.makespan = span(all);
  return s;
}

TagTime TaggedTime::of(uint64_t tag) const {
  for (const TagTime& t : tags)
    if (t.tag == tag) return t;
  TagTime none;
  none.tag = tag;
  return none;
}

TaggedTime time_by_tag(const std::vector<ActivityBuffer>& buffers) {
  TaggedTime out;
  // correlation id -> tag; a second, different tag for the same id marks it conflicting (kConflict).
  constexpr uint64_t kConflict = std::numeric_limits<uint64_t>::max();
  std::unordered_map<uint32_t, uint64_t> tag_of;
  for (const ActivityBuffer& b : buffers) {
    out.dropped += b.dropped;
    for (const TagRecord& t : b.tags) {
      auto [it, fresh] = tag_of.emplace(t.correlation, t.tag);
      if (!fresh && it->second != t.tag) it->second = kConflict;
    }
  }
  std::map<uint64_t, std::pair<TagTime, std::vector<Interval>>> by_tag;
  uint64_t ref = 0;
  for_each_timed(buffers, ref, [&](const ActivityRecord& r, int64_t s, int64_t e) {
    const auto it = r.correlation ? tag_of.find(r.correlation) : tag_of.end();
    if (it == tag_of.end()) {
      ++out.untagged;
      return;
    }
    if (it->second == kConflict) {
      ++out.conflicting;
      return;
    }
    auto& [time, intervals] = by_tag[it->second];
    time.tag = it->second;
    ++time.records;
    if (r.kind == ActivityKind::Kernel) time.kernel_seconds += double(e - s) * 1e-9;
    intervals.push_back({double(s) * 1e-9, double(e) * 1e-9});
  });
  for (auto& [tag, entry] : by_tag) {
    entry.first.busy_seconds = busy(entry.second);
    out.tags.push_back(entry.first);
  }
  return out;
}

}  // namespace lcplan::profiler
