// Memory accounting of lcplan-exec: every tensor the executor holds is a Buf charged to one of the estimator's
// memory categories (estimator/memory_model.h MemoryBreakdown, README "What each number means"), and kernel-internal
// buffers the executor cannot allocate itself are charged by their known sizes (Tracker::Charge). The tracker keeps
// the live bytes per category and, per schedule phase, the peak total with the per-category breakdown at that
// moment. No global state: one Tracker per rank, passed explicitly.
//
// Workspace is reported like a GPU framework's fixed workspace: the executor reserves `workspace_reserve` bytes
// (memory.workspace_bytes of the executor's calibration profile) for fp32 temporaries, activation gradients and
// kernel scratch; the category reads max(reserve, high-water of live workspace bytes so far), and the high-water
// itself is reported so a run that outgrew the reservation shows it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "estimator/memory_model.h"

namespace lcplan::exec {

// The estimator's categories (estimator/memory_categories.h); the executor holds bytes of those before cuda_context
// (which lives outside any allocator) and fragmentation (the allocator's own overhead), and records those two as 0.
using Category = MemoryCategory;
constexpr int kCategories = static_cast<int>(Category::CudaContext);
static_assert(static_cast<int>(Category::Workspace) == kCategories - 1, "the tracked categories come first");
inline const char* category_key(Category c) { return memory_category(c).name; }  // the records' breakdown key

constexpr int kPhases = 4;  // lcplan::Phase: Forward, Loss, Backward, Optimizer

// Bytes per category at one moment, and their total.
struct Snapshot {
  std::array<double, kCategories> bytes{};
  double total() const;
  MemoryBreakdown to_breakdown() const;  // cuda_context and fragmentation are 0 on the executor
};

struct PhasePeak {
  bool seen = false;      // the phase ran at least once
  Snapshot at_peak;       // breakdown when the phase's total peaked
  Snapshot category_max;  // each category's own largest value during the phase (the estimator's phase terms are
                          // such maxima: the largest rebuilt layer, the MoE buffers of the busiest layer, ...)
};

class Tracker {
 public:
  explicit Tracker(double workspace_reserve = 0) : reserve_(workspace_reserve) {}
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  // Peaks are recorded only while a phase is set (setup and initialisation are not part of a step).
  void set_phase(Phase p);
  void clear_phase() { phase_ = -1; }
  bool in_phase() const { return phase_ >= 0; }

  void add(Category c, double bytes);
  void sub(Category c, double bytes);

  Snapshot now() const;
  const PhasePeak& peak(Phase p) const { return peaks_[static_cast<int>(p)]; }
  // The phase whose peak total is largest (first on ties, in schedule order) and its snapshot.
  std::pair<Phase, Snapshot> overall_peak() const;
  double live(Category c) const { return live_[static_cast<int>(c)]; }
  double live_total() const;                          // bytes held now (the workspace reservation excluded)
  int64_t live_charges() const { return charges_; }  // Charges (so Bufs and DeviceBufs) alive now
  double workspace_high_water() const { return ws_high_; }
  double workspace_reserve() const { return reserve_; }
  uint64_t operations() const { return ops_; }  // add/sub calls, for the overhead benchmark
  // The GPU backend's compute stream (a cudaStream_t, opaque here so this header stays host-only): device buffers
  // charged to this tracker are allocated, zeroed and freed in its order (executor/device_buf_cuda.h). Null: plain.
  void set_device_stream(void* s) { stream_ = s; }
  void* device_stream() const { return stream_; }

  // Charges `bytes` to `c` for its lifetime: kernel buffers the executor does not own (MoE layer vectors, a kernel's
  // reported scratch peak) held while the call that owns them is in scope.
  class Charge {
   public:
    Charge() = default;
    Charge(Tracker& t, Category c, double bytes) : t_(&t), c_(c), bytes_(bytes) {
      t_->add(c_, bytes_);
      ++t_->charges_;
    }
    Charge(Charge&& o) noexcept : t_(std::exchange(o.t_, nullptr)), c_(o.c_), bytes_(o.bytes_) {}
    Charge& operator=(Charge&& o) noexcept {
      if (this != &o) {
        release();
        t_ = std::exchange(o.t_, nullptr);
        c_ = o.c_;
        bytes_ = o.bytes_;
      }
      return *this;
    }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    ~Charge() { release(); }
    void release() {
      if (t_) {
        t_->sub(c_, bytes_);
        --t_->charges_;
      }
      t_ = nullptr;
    }

   private:
    Tracker* t_ = nullptr;
    Category c_ = Category::Workspace;
    double bytes_ = 0;
  };

 private:
  void record();
  double reserve_ = 0;
  std::array<double, kCategories> live_{};
  double ws_high_ = 0;
  int phase_ = -1;
  std::array<PhasePeak, kPhases> peaks_{};
  uint64_t ops_ = 0;
  int64_t charges_ = 0;
  void* stream_ = nullptr;
};

// n elements of T owned by the caller and charged to a category while alive (zero-initialised). Move-only.
template <class T>
class Buf {
 public:
  Buf() = default;
  Buf(Tracker& t, Category c, size_t n) : data_(new T[n > 0 ? n : 1]()), n_(n), charge_(t, c, double(n) * sizeof(T)) {}
  Buf(Buf&&) noexcept = default;
  Buf& operator=(Buf&&) noexcept = default;
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void reset() {
    charge_.release();
    data_.reset();
    n_ = 0;
  }

 private:
  std::unique_ptr<T[]> data_;
  size_t n_ = 0;
  Tracker::Charge charge_;
};

// The CPU backend's stand-in for a caching allocator (PyTorch's reuses device blocks across steps): glibc keeps
// freed blocks of every size in its heap instead of returning large ones to the kernel, so each step's temporaries
// reuse pages rather than fault fresh zeroed ones (~6% of a step at the time test's sizes, and varying with the
// host's memory state). Process-wide: call once at startup, before the first step. Byte accounting is unchanged
// (the tracker counts what the executor holds, not what the heap keeps). A no-op off glibc and under ASan.
void retain_freed_host_memory();

}  // namespace lcplan::exec
