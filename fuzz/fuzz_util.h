// Shared helpers for the fuzz targets: parse bytes as JSON, and treat only UserError as an acceptable outcome.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lcplan::fuzz {

inline std::optional<nlohmann::json> parse_json(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// A property the code under test must keep; a violation is a finding, reported like a crash.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

inline bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }

// Bytes -> small integers, deterministic and total (a replay of the same file gives the same plan).
struct ByteReader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  // Little-endian, one statement per byte: operands of `|` are evaluated in an unspecified order, so reading them
  // inside one expression would let the compiler decide which byte lands where (and replays differ across builds).
  uint32_t u32() {
    uint32_t v = byte();
    v |= uint32_t(byte()) << 8;
    v |= uint32_t(byte()) << 16;
    v |= uint32_t(byte()) << 24;
    return v;
  }
  template <typename T, size_t N>
  T pick(const T (&choices)[N]) { return choices[byte() % N]; }
};

}  // namespace lcplan::fuzz
