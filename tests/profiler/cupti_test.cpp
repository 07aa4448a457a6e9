// The CUPTI tracer on a device: memset and memcpy records land on the streams they ran on, with positive intervals
// and no drops; a second live tracer is refused; tagged regions get their own device time. Skips without a usable
// device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/common/cuda_check.h"
#include "profiler/cupti_tracer.h"
#include "tests/attention/device_buffer.h"

namespace lcplan::profiler {
namespace {

using lcplan::test::DeviceFloats;
using lcplan::test::Stream;

constexpr size_t kBytes = size_t(64) << 20;  // per buffer: long enough to time, well under any device's memory

TEST(CuptiTracer, RecordsCopiesPerStream) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  CuptiTracer tracer;
  EXPECT_THROW(CuptiTracer second, std::runtime_error);
  const Stream a, b;
  const DeviceFloats x(kBytes / sizeof(float)), y(kBytes / sizeof(float));
  (void)tracer.take();
  CUDA_CHECK(cudaMemsetAsync(x.get(), 1, kBytes, a.get()));
  CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), kBytes, cudaMemcpyDeviceToDevice, b.get()));
  CUDA_CHECK(cudaStreamSynchronize(a.get()));
  CUDA_CHECK(cudaStreamSynchronize(b.get()));
  const Trace t = build_trace(tracer.take());
  EXPECT_TRUE(t.complete());
  const std::vector<Interval> on_a = t.of(tracer.stream_id(a.get())), on_b = t.of(tracer.stream_id(b.get()));
  ASSERT_FALSE(on_a.empty());
  ASSERT_FALSE(on_b.empty());
  EXPECT_GT(busy(on_a), 0);
  EXPECT_GT(busy(on_b), 0);
  EXPECT_LT(span(t.all()), 10.0);  // seconds: the clock is in nanoseconds, not garbage
}

TEST(CuptiTracer, TagsAttributeDeviceTimeToRegions) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  {
    CuptiTracer untagged;
    EXPECT_THROW(untagged.push_tag(1), std::logic_error);
  }
  CuptiTracer tracer(size_t(8) << 20, Tags::On);
  const Stream s;
  const DeviceFloats x(kBytes / sizeof(float)), y(kBytes / sizeof(float));
  (void)tracer.take();
  tracer.push_tag(1);  // one memset
  CUDA_CHECK(cudaMemsetAsync(x.get(), 1, kBytes, s.get()));
  tracer.pop_tag();
  tracer.push_tag(2);  // two copies, each as long as the memset or longer (read + write)
  CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), kBytes, cudaMemcpyDeviceToDevice, s.get()));
  CUDA_CHECK(cudaMemcpyAsync(x.get(), y.get(), kBytes, cudaMemcpyDeviceToDevice, s.get()));
  tracer.pop_tag();
  CUDA_CHECK(cudaMemsetAsync(y.get(), 0, kBytes, s.get()));  // outside every region
  CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_THROW(tracer.pop_tag(), std::runtime_error);  // the stack is empty
  const TaggedTime t = time_by_tag(tracer.take());
  EXPECT_EQ(t.dropped, 0u);
  EXPECT_EQ(t.conflicting, 0u);
  EXPECT_EQ(t.of(1).records, 1u);
  EXPECT_EQ(t.of(2).records, 2u);
  EXPECT_GE(t.untagged, 1u);
  EXPECT_GT(t.of(1).busy_seconds, 0);
  EXPECT_GT(t.of(2).busy_seconds, t.of(1).busy_seconds);
  EXPECT_LT(t.of(2).busy_seconds, 1.0);  // seconds, not raw nanoseconds
}

}  // namespace
}  // namespace lcplan::profiler
