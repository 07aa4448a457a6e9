// The CUPTI tracer on a device: memset and memcpy records land on the streams they ran on, with positive intervals
// and no drops; a second live tracer is refused; tagged regions get their own device time. Skips without a usable
// device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/common/cuda_check.h"
#include "profiler/cupti_tracer.h"

namespace lcplan::profiler {
namespace {

TEST(CuptiTracer, RecordsCopiesPerStream) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  CuptiTracer tracer;
  EXPECT_THROW(CuptiTracer second, std::runtime_error);
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  const size_t bytes = size_t(64) << 20;
  void *x = nullptr, *y = nullptr;
  CUDA_CHECK(cudaMalloc(&x, bytes));
  CUDA_CHECK(cudaMalloc(&y, bytes));
  (void)tracer.take();
  CUDA_CHECK(cudaMemsetAsync(x, 1, bytes, a));
  CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, b));
  CUDA_CHECK(cudaStreamSynchronize(a));
  CUDA_CHECK(cudaStreamSynchronize(b));
  const Trace t = build_trace(tracer.take());
  EXPECT_TRUE(t.complete());
  const std::vector<Interval> on_a = t.of(tracer.stream_id(a)), on_b = t.of(tracer.stream_id(b));
  ASSERT_FALSE(on_a.empty());
  ASSERT_FALSE(on_b.empty());
  EXPECT_GT(busy(on_a), 0);
  EXPECT_GT(busy(on_b), 0);
  EXPECT_LT(span(t.all()), 10.0);  // seconds: the clock is in nanoseconds, not garbage
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(y));
  CUDA_CHECK(cudaStreamDestroy(a));
  CUDA_CHECK(cudaStreamDestroy(b));
}

TEST(CuptiTracer, TagsAttributeDeviceTimeToRegions) {
  if (!gpu::device_available()) GTEST_SKIP() << "no usable CUDA device";
  {
    CuptiTracer untagged;
    EXPECT_THROW(untagged.push_tag(1), std::logic_error);
  }
  CuptiTracer tracer(size_t(8) << 20, Tags::On);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t bytes = size_t(64) << 20;
  void *x = nullptr, *y = nullptr;
  CUDA_CHECK(cudaMalloc(&x, bytes));
  CUDA_CHECK(cudaMalloc(&y, bytes));
  (void)tracer.take();
  tracer.push_tag(1);  // one memset
  CUDA_CHECK(cudaMemsetAsync(x, 1, bytes, s));
  tracer.pop_tag();
  tracer.push_tag(2);  // two copies, each as long as the memset or longer (read + write)
  CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(x, y, bytes, cudaMemcpyDeviceToDevice, s));
  tracer.pop_tag();
  CUDA_CHECK(cudaMemsetAsync(y, 0, bytes, s));  // outside every region
  CUDA_CHECK(cudaStreamSynchronize(s));
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
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(y));
  CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace lcplan::profiler
