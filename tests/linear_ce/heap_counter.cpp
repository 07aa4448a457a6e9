// Interposes the glibc malloc family in the test binary (glibc supports replacing malloc this way) and forwards to
// glibc's own allocator through its exported __libc_* entry points; sizes come from malloc_usable_size, so no header
// is added to blocks and a block allocated by any path can be freed by any other.
#include "tests/linear_ce/heap_counter.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define LCPLAN_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LCPLAN_SANITIZED 1
#endif

#if defined(__GLIBC__) && !defined(LCPLAN_SANITIZED)
#define LCPLAN_HEAP_COUNTING 1
#include <malloc.h>
#else
#define LCPLAN_HEAP_COUNTING 0
#endif

namespace {

std::atomic<long long> g_live{0};
std::atomic<long long> g_peak{0};

#if LCPLAN_HEAP_COUNTING
void note_alloc(void* p) {
  if (p == nullptr) return;
  const long long now = g_live.fetch_add(static_cast<long long>(malloc_usable_size(p))) +
                        static_cast<long long>(malloc_usable_size(p));
  long long peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void note_free(void* p) {
  if (p != nullptr) g_live.fetch_sub(static_cast<long long>(malloc_usable_size(p)));
}
#endif

}  // namespace

#if LCPLAN_HEAP_COUNTING
extern "C" {
// glibc's allocator under its exported internal names (declared here: no public header has them).
void* __libc_malloc(size_t) noexcept;
void __libc_free(void*) noexcept;
void* __libc_calloc(size_t, size_t) noexcept;
void* __libc_realloc(void*, size_t) noexcept;
void* __libc_memalign(size_t, size_t) noexcept;
void* __libc_valloc(size_t) noexcept;
void* __libc_pvalloc(size_t) noexcept;


void* malloc(size_t n) noexcept {
  void* p = __libc_malloc(n);
  note_alloc(p);
  return p;
}
void free(void* p) noexcept {
  note_free(p);
  __libc_free(p);
}
void* calloc(size_t a, size_t b) noexcept {
  void* p = __libc_calloc(a, b);
  note_alloc(p);
  return p;
}
void* realloc(void* p, size_t n) noexcept {
  const long long old = p ? static_cast<long long>(malloc_usable_size(p)) : 0;
  void* q = __libc_realloc(p, n);
  if (q == nullptr && n != 0) return q;  // failed: the old block is untouched and still counted
  g_live.fetch_sub(old);
  note_alloc(q);
  return q;
}
void* memalign(size_t align, size_t n) noexcept {
  void* p = __libc_memalign(align, n);
  note_alloc(p);
  return p;
}
void* aligned_alloc(size_t align, size_t n) noexcept { return memalign(align, n); }
int posix_memalign(void** out, size_t align, size_t n) noexcept {
  if (align % sizeof(void*) != 0 || (align & (align - 1)) != 0) return EINVAL;
  void* p = memalign(align, n);
  if (p == nullptr && n != 0) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(size_t n) noexcept {
  void* p = __libc_valloc(n);
  note_alloc(p);
  return p;
}
void* pvalloc(size_t n) noexcept {
  void* p = __libc_pvalloc(n);
  note_alloc(p);
  return p;
}
}  // extern "C"
#endif

namespace lcplan::linear_ce::test {

bool heap_counting() { return LCPLAN_HEAP_COUNTING != 0; }

HeapWindow::HeapWindow() : base_(g_live.load()) { g_peak.store(base_); }

size_t HeapWindow::peak() const {
  const long long p = g_peak.load() - base_;
  return p > 0 ? static_cast<size_t>(p) : 0;
}

}  // namespace lcplan::linear_ce::test
