// Scratch buffers that charge their bytes to a per-call meter, so a kernel's peak extra memory is measured, not
// estimated (the linear CE, attention and linear-attention CPU paths).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>

namespace lcplan::kernels {

class ScratchMeter {
 public:
  void add(size_t b) {
    current_ += b;
    peak_ = std::max(peak_, current_);
  }
  void sub(size_t b) { current_ -= b; }
  size_t peak() const { return peak_; }

 private:
  size_t current_ = 0;
  size_t peak_ = 0;
};

// Owns n elements of T, zeroed unless `zero` is false (a buffer fully written before it is read), charged to the
// meter while alive.
template <class T>
class Scratch {
 public:
  Scratch(ScratchMeter& m, size_t n, bool zero = true)
      : meter_(&m), n_(n), data_(zero ? new T[n > 0 ? n : 1]() : new T[n > 0 ? n : 1]) {
    meter_->add(n_ * sizeof(T));
  }
  ~Scratch() { meter_->sub(n_ * sizeof(T)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  size_t size() const { return n_; }

 private:
  ScratchMeter* meter_;
  size_t n_;
  std::unique_ptr<T[]> data_;
};

}  // namespace lcplan::kernels
