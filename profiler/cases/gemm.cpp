// Case gemm: dense GEMMs C[m x n] = A[m x k] B[k x n] by tokens m for each (n, k) class; fits time.gemm_efficiency
// and time.gemm_half_tokens (and, on GPUs with fp8, time.fp8_gemm_ratio).
#include <algorithm>
#include <stdexcept>

#include "profiler/cases.h"

namespace lcplan::profiler {

void run_gemm(CaseContext& c) {
  for (const std::string& type : c.dev.gemm_types()) {
    std::vector<std::pair<int64_t, int64_t>> timed;  // (n, k) already swept: shrunk classes may coincide
    for (const GemmClass& cls : c.t.gemm_classes) {
      int64_t n = cls.n, k = cls.k;
      // Keep the class while a mid-size token count (1024) fits the budget: shrink n and k, never below 128.
      int64_t ref = 0;
      for (int64_t m : c.t.gemm_tokens)
        if (m <= 1024) ref = m;
      if (ref == 0 && !c.t.gemm_tokens.empty()) ref = c.t.gemm_tokens.front();
      const std::string shrunk =
          shrink_to_budget({{"n", &n, 128, 0}, {"k", &k, 128, 0}}, [&] { return 2.0 * double(ref) * n * k; }, c.budget());
      if (!shrunk.empty())
        c.note("gemm " + cls.name + " (" + std::to_string(cls.n) + "x" + std::to_string(cls.k) + "): " + shrunk +
               " to fit the CPU budget of " + gflop(c.budget()) + " per call");
      if (std::find(timed.begin(), timed.end(), std::pair<int64_t, int64_t>{n, k}) != timed.end()) {
        c.note("gemm " + cls.name + ": shrunk to " + std::to_string(n) + "x" + std::to_string(k) +
               ", a shape already timed");
        continue;
      }
      timed.push_back({n, k});
      std::string skipped;
      for (int64_t m : c.t.gemm_tokens) {
        if (c.budget() > 0 && 2.0 * double(m) * n * k > c.budget()) {
          skipped.append(skipped.empty() ? "" : ",").append(std::to_string(m));  // append: GCC 12 -Wrestrict false positive on operator+
          continue;
        }
        if (type == "fp8" && (m % 16 || n % 16 || k % 16)) {
          // fp8 GEMMs need leading dimensions in multiples of 16 (cuBLASLt FP8 requirements).
          c.note("gemm fp8 " + cls.name + ": m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                 std::to_string(k) + " not a multiple of 16, not timed");
          continue;
        }
        Timing tm;
        try {
          tm = c.dev.gemm(m, n, k, type);
        } catch (const std::invalid_argument& e) {  // no fp8 algorithm for this shape: the same on every rank
          c.note("gemm " + type + " " + cls.name + ": " + e.what());
          continue;
        }
        c.data.gemm.push_back({m, n, k, type, cls.name, tm.seconds});
        c.log("gemm " + type + " " + cls.name + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
              std::to_string(k) + ": " + std::to_string(tm.seconds * 1e3) + " ms");
      }
      if (!skipped.empty())
        c.note("gemm " + cls.name + ": tokens " + skipped + " over the CPU budget of " + gflop(c.budget()) + ", not timed");
    }
  }
}

}  // namespace lcplan::profiler
