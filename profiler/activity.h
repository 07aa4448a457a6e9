// Device activity records -> per-stream intervals -> busy time, union and overlap, in pure code (no CUDA, no CUPTI),
// so the arithmetic the GPU profile rests on is tested on synthetic buffers (tests/profiler/activity_test.cpp).
//
// The CUPTI tracer (cupti_tracer.h) converts each buffer CUPTI completes into an ActivityBuffer: its kernel, memcpy
// and memset records (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL / MEMCPY / MEMSET: start and end in nanoseconds of the
// GPU's 64-bit timestamp counter, device, stream) and the records CUPTI dropped for want of buffer space
// (cuptiActivityGetNumDroppedRecords). build_trace() puts every record on one time axis:
//  - timestamps are read as offsets from the first record's start, modulo 2^64, so a counter that wraps inside a
//    trace keeps its order (valid while the trace spans less than 2^63 ns, 292 years);
//  - a record whose end lies before its start (CUPTI leaves start = end = 0 when it could not time an activity)
//    is counted in `invalid` and left out;
//  - dropped records are summed: a trace with drops under-counts busy time, and complete() says so.
//
// Tags attribute device time to regions of the host program (the executor's phases): the tracer pushes a tag
// (cuptiActivityPushExternalCorrelationId) around a region, CUPTI writes one EXTERNAL_CORRELATION record per API
// call made inside it (the call's correlation id and the tag), and every kernel, copy or memset carries the
// correlation id of the call that launched it. time_by_tag() joins the two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lcplan::profiler {

enum class ActivityKind : uint8_t { Kernel, Memcpy, Memset };
const char* to_string(ActivityKind k);

// One activity as CUPTI reports it: [start, end) in nanoseconds of the device's timestamp counter.
struct ActivityRecord {
  ActivityKind kind = ActivityKind::Kernel;
  uint32_t device = 0;
  uint32_t stream = 0;      // CUPTI stream id (cuptiGetStreamIdEx of the cudaStream_t)
  uint64_t start = 0;       // raw counter values: they may wrap past 2^64
  uint64_t end = 0;
  uint64_t bytes = 0;       // memcpy / memset size
  std::string name;         // kernel name (empty for copies)
  uint32_t correlation = 0; // correlation id of the API call that launched it (0: none)
};

// CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: the API call `correlation` was made while `tag` was pushed.
struct TagRecord {
  uint32_t correlation = 0;
  uint64_t tag = 0;
};

// One buffer as CUPTI completed it.
struct ActivityBuffer {
  std::vector<ActivityRecord> records;
  uint64_t dropped = 0;     // records CUPTI could not store while this buffer was being filled
  std::vector<TagRecord> tags;
};

// Half-open [start, end) in seconds from the trace origin.
struct Interval {
  double start = 0, end = 0;
};

struct StreamIntervals {
  uint32_t device = 0, stream = 0;
  std::vector<Interval> intervals;  // sorted by start, as recorded (may overlap: concurrent kernels)
};

struct Trace {
  std::vector<StreamIntervals> streams;  // sorted by (device, stream)
  uint64_t records = 0;                  // records placed on the axis
  uint64_t invalid = 0;                  // records with end before start (left out)
  uint64_t dropped = 0;                  // records CUPTI dropped (sum over buffers)
  uint64_t origin = 0;                   // raw counter value of t = 0 (the earliest start)
  bool complete() const { return dropped == 0; }
  // The intervals of one stream (empty when it ran nothing).
  std::vector<Interval> of(uint32_t stream) const;
  // Every interval of every stream.
  std::vector<Interval> all() const;
};

Trace build_trace(const std::vector<ActivityBuffer>& buffers);

// Sorted, disjoint union of `v` (touching intervals merge; empty ones vanish).
std::vector<Interval> merge(std::vector<Interval> v);
// Total length of the union of `v`.
double busy(const std::vector<Interval>& v);
// Time covered by both unions.
double both_busy(const std::vector<Interval>& a, const std::vector<Interval>& b);
// Last end minus first start (0 when empty).
double span(const std::vector<Interval>& v);

// Two streams of one pass: a compute stream and a communication stream.
struct OverlapSummary {
  double compute_busy = 0;  // union of the compute stream's intervals
  double comm_busy = 0;     // union of the communication stream's intervals
  double both = 0;          // time both were busy
  double union_busy = 0;    // time at least one was busy
  double makespan = 0;      // first start to last end over both
  // Measured overlap: share of the communication time that ran while compute ran (0 when there is no
  // communication).
  double overlap() const { return comm_busy > 0 ? both / comm_busy : 0; }
};
OverlapSummary overlap_summary(const std::vector<Interval>& compute, const std::vector<Interval>& comm);

// Device time of one tag's activities.
struct TagTime {
  uint64_t tag = 0;
  uint64_t records = 0;       // activities launched under the tag (invalid ones left out, as in build_trace)
  double kernel_seconds = 0;  // sum of its kernels' durations (concurrent kernels each counted)
  double busy_seconds = 0;    // union of all its activities' intervals over every stream: the device busy with it
};
struct TaggedTime {
  std::vector<TagTime> tags;  // sorted by tag, only tags that launched something
  uint64_t untagged = 0;      // valid activities whose launch had no tag (work outside every tagged region)
  uint64_t conflicting = 0;   // activities whose correlation id carries two different tags (left out)
  uint64_t dropped = 0;       // records CUPTI dropped: the times under-count when non-zero
  // The entry of `tag`, or a zero entry with that tag.
  TagTime of(uint64_t tag) const;
};
// Joins activities to tags by correlation id (wrap-safe durations, as build_trace).
TaggedTime time_by_tag(const std::vector<ActivityBuffer>& buffers);

}  // namespace lcplan::profiler
