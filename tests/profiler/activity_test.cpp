// CUPTI activity arithmetic on synthetic buffers (profiler/activity.h): per-stream intervals, busy time, union and
// overlap of two streams, wrapped 64-bit timestamps, invalid and dropped records, device time per tag.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "profiler/activity.h"

namespace lcplan::profiler {
namespace {

ActivityRecord kernel(uint32_t stream, uint64_t start, uint64_t end) {
  return {ActivityKind::Kernel, 0, stream, start, end, 0, "k", 0};
}

constexpr double kNs = 1e-9;

TEST(Activity, NonOverlappingStreams) {
  // compute [0, 100) and [300, 400) ns; comm [100, 300) ns: back to back, nothing overlaps.
  const Trace t = build_trace({{{kernel(1, 1000, 1100), kernel(2, 1100, 1300), kernel(1, 1300, 1400)}, 0, {}}});
  ASSERT_EQ(t.records, 3u);
  EXPECT_EQ(t.origin, 1000u);
  const OverlapSummary s = overlap_summary(t.of(1), t.of(2));
  EXPECT_NEAR(s.compute_busy, 200 * kNs, 1e-15);
  EXPECT_NEAR(s.comm_busy, 200 * kNs, 1e-15);
  EXPECT_NEAR(s.both, 0, 1e-15);
  EXPECT_NEAR(s.union_busy, 400 * kNs, 1e-15);
  EXPECT_NEAR(s.makespan, 400 * kNs, 1e-15);
  EXPECT_EQ(s.overlap(), 0);
}

TEST(Activity, OverlappingStreams) {
  // compute [0, 100); comm [50, 250): both busy 50 of comm's 200 ns -> overlap 0.25.
  const Trace t = build_trace({{{kernel(7, 0 + 10, 100 + 10), kernel(9, 50 + 10, 250 + 10)}, 0, {}}});
  const OverlapSummary s = overlap_summary(t.of(7), t.of(9));
  EXPECT_NEAR(s.both, 50 * kNs, 1e-15);
  EXPECT_NEAR(s.overlap(), 0.25, 1e-12);
  EXPECT_NEAR(s.union_busy, 250 * kNs, 1e-15);
  // A comm stream entirely under compute is fully overlapped.
  const Trace u = build_trace({{{kernel(1, 0 + 5, 1000 + 5), kernel(2, 100 + 5, 300 + 5), kernel(2, 400 + 5, 600 + 5)}, 0, {}}});
  EXPECT_NEAR(overlap_summary(u.of(1), u.of(2)).overlap(), 1.0, 1e-12);
}

TEST(Activity, ConcurrentKernelsOnOneStreamCountOnce) {
  // Two kernels of one stream overlapping (CONCURRENT_KERNEL): busy is the union, not the sum.
  const Trace t = build_trace({{{kernel(3, 100, 300), kernel(3, 200, 500), kernel(3, 600, 700)}, 0, {}}});
  EXPECT_NEAR(busy(t.of(3)), 500 * kNs, 1e-15);
  EXPECT_NEAR(span(t.of(3)), 600 * kNs, 1e-15);
  EXPECT_EQ(merge(t.of(3)).size(), 2u);
}

TEST(Activity, WrappedTimestampsKeepTheirOrder) {
  // The counter wraps past 2^64 between the compute kernel's start and the comm kernel: offsets modulo 2^64.
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  const uint64_t c0 = top - 99;   // compute [c0, c0 + 200): ends after the wrap, at 100
  const uint64_t c1 = c0 + 200;   // wraps to 100
  const uint64_t m0 = top - 49;   // comm [m0, m0 + 300): ends at 250 after the wrap
  const uint64_t m1 = m0 + 300;
  ASSERT_LT(c1, c0);
  ASSERT_LT(m1, m0);
  const Trace t = build_trace({{{kernel(1, c0, c1)}, 0, {}}, {{kernel(2, m0, m1)}, 0, {}}});
  EXPECT_EQ(t.invalid, 0u);
  EXPECT_EQ(t.origin, c0);
  const OverlapSummary s = overlap_summary(t.of(1), t.of(2));
  EXPECT_NEAR(s.compute_busy, 200 * kNs, 1e-15);
  EXPECT_NEAR(s.comm_busy, 300 * kNs, 1e-15);
  EXPECT_NEAR(s.both, 150 * kNs, 1e-15);  // [m0, c1)
  EXPECT_NEAR(s.makespan, 350 * kNs, 1e-15);
  // A record that starts before the first one (out of buffer order) moves the origin back, also across the wrap.
  const Trace u = build_trace({{{kernel(1, 50, 80)}, 0, {}}, {{kernel(1, top - 9, 20)}, 0, {}}});
  EXPECT_EQ(u.origin, top - 9);
  EXPECT_NEAR(span(u.of(1)), 90 * kNs, 1e-15);
}

TEST(Activity, DroppedAndInvalidRecordsAreCounted) {
  const Trace t = build_trace({{{kernel(1, 100, 200), kernel(1, 0, 0)}, 3, {}},
                               {{kernel(1, 500, 400), kernel(2, 300, 350)}, 2, {}}});
  EXPECT_EQ(t.dropped, 5u);
  EXPECT_FALSE(t.complete());
  EXPECT_EQ(t.invalid, 2u);  // start = end = 0 (not timed) and end before start
  EXPECT_EQ(t.records, 2u);
  const Trace ok = build_trace({{{kernel(1, 100, 200)}, 0, {}}});
  EXPECT_TRUE(ok.complete());
}

TEST(Activity, EmptyInputs) {
  const Trace t = build_trace({});
  EXPECT_EQ(t.records, 0u);
  EXPECT_TRUE(t.of(1).empty());
  EXPECT_EQ(busy({}), 0);
  EXPECT_EQ(span({}), 0);
  const OverlapSummary s = overlap_summary({}, {});
  EXPECT_EQ(s.overlap(), 0);
  EXPECT_EQ(both_busy({{0, 1}}, {}), 0);
}

TEST(Activity, StreamsSeparatedByDeviceAndKind) {
  ActivityRecord copy{ActivityKind::Memcpy, 0, 4, 0 + 1, 100 + 1, 1 << 20, "", 0};
  ActivityRecord other{ActivityKind::Kernel, 1, 4, 0 + 1, 100 + 1, 0, "k", 0};  // same stream id on another device
  const Trace t = build_trace({{{copy, other}, 0, {}}});
  EXPECT_EQ(t.streams.size(), 2u);
  EXPECT_NEAR(busy(t.all()), 100 * kNs, 1e-15);
}

ActivityRecord launched(ActivityKind kind, uint32_t stream, uint64_t start, uint64_t end, uint32_t correlation) {
  return {kind, 0, stream, start, end, 0, kind == ActivityKind::Kernel ? "k" : "", correlation};
}

TEST(Activity, TimeByTagJoinsCorrelationIds) {
  // Tag 1 (forward): kernels [0, 100) and [50, 150) on two streams (concurrent) and a memset [200, 250).
  // Tag 2 (backward): one kernel [300, 500) whose tag record arrives in a later buffer than the kernel.
  // Correlation 9 has no tag (launched outside every region); correlation 5 carries two tags.
  ActivityBuffer first{{launched(ActivityKind::Kernel, 1, 1000, 1100, 3), launched(ActivityKind::Kernel, 2, 1050, 1150, 4),
                        launched(ActivityKind::Memset, 1, 1200, 1250, 6), launched(ActivityKind::Kernel, 1, 1300, 1500, 7),
                        launched(ActivityKind::Kernel, 1, 1600, 1700, 9), launched(ActivityKind::Kernel, 1, 1700, 1800, 5)},
                       0,
                       {{3, 1}, {4, 1}, {6, 1}, {5, 1}}};
  ActivityBuffer second{{}, 2, {{7, 2}, {5, 2}}};
  const TaggedTime t = time_by_tag({first, second});
  ASSERT_EQ(t.tags.size(), 2u);
  EXPECT_EQ(t.tags[0].tag, 1u);
  EXPECT_EQ(t.tags[0].records, 3u);
  EXPECT_NEAR(t.tags[0].kernel_seconds, 200 * kNs, 1e-15);  // both kernels counted, the memset is not a kernel
  EXPECT_NEAR(t.tags[0].busy_seconds, 200 * kNs, 1e-15);    // union [0, 150) + [200, 250)
  EXPECT_EQ(t.of(2).records, 1u);
  EXPECT_NEAR(t.of(2).kernel_seconds, 200 * kNs, 1e-15);
  EXPECT_NEAR(t.of(2).busy_seconds, 200 * kNs, 1e-15);
  EXPECT_EQ(t.untagged, 1u);
  EXPECT_EQ(t.conflicting, 1u);
  EXPECT_EQ(t.dropped, 2u);
  EXPECT_EQ(t.of(3).records, 0u);  // a tag that launched nothing reads zero
  EXPECT_EQ(t.of(3).tag, 3u);
}

TEST(Activity, TimeByTagAcrossACounterWrap) {
  // A tagged kernel that straddles the 2^64 wrap lasts 200 ns, not 2^64 - 200.
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  ActivityBuffer b{{launched(ActivityKind::Kernel, 1, top - 99, top - 99 + 200, 1),
                    launched(ActivityKind::Kernel, 1, 0, 0, 2)},  // untimed: left out, neither tagged nor untagged
                   0,
                   {{1, 42}, {2, 42}}};
  const TaggedTime t = time_by_tag({b});
  EXPECT_NEAR(t.of(42).kernel_seconds, 200 * kNs, 1e-15);
  EXPECT_EQ(t.of(42).records, 1u);
  EXPECT_EQ(t.untagged, 0u);
  EXPECT_TRUE(time_by_tag({}).tags.empty());
}

}  // namespace
}  // namespace lcplan::profiler
