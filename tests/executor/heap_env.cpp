// Every executor test binary runs on the heap lcplan-exec runs with (executor/tracking_allocator.h
// retain_freed_host_memory), set up before its first test.
#include <gtest/gtest.h>

#include "executor/tracking_allocator.h"

namespace {

class RetainFreedHostMemory : public ::testing::Environment {
 public:
  void SetUp() override { lcplan::exec::retain_freed_host_memory(); }
};

::testing::Environment* const heap_env = ::testing::AddGlobalTestEnvironment(new RetainFreedHostMemory);

}  // namespace
