// Counts every heap byte of the test process (malloc family, so operator new and Eigen's own std::malloc calls
// alike), to catch allocations that bypass the linear CE scratch meter, e.g. an Eigen temporary.
#pragma once

#include <cstddef>

namespace lcplan::linear_ce::test {

// False when malloc could not be interposed (sanitizer builds, non-glibc): heap tests skip themselves then.
bool heap_counting();

// Peak live heap bytes above the level at construction, over the window's lifetime. One window at a time.
class HeapWindow {
 public:
  HeapWindow();
  size_t peak() const;

 private:
  long long base_;
};

}  // namespace lcplan::linear_ce::test
