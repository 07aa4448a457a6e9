// Fuzz target: size strings ("128k", "1.5M", "64K") and the other plan value parsers. Valid or UserError; an
// accepted size is a positive whole number that reads back the same when printed in plain digits.
#include <cstdint>
#include <string>

#include "estimator/plan.h"
#include "fuzz/fuzz_util.h"
#include "common/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const int64_t v = parse_size(text, "--seq");
    fuzz::require(v >= 1, "parsed sizes are at least 1");
    fuzz::require(parse_size(std::to_string(v), "--seq") == v, "a parsed size prints and parses back to itself");
  } catch (const UserError&) {
  }
  try { (void)parse_precision(text); } catch (const UserError&) {}
  try { (void)parse_recompute(text); } catch (const UserError&) {}
  try { (void)parse_optimizer_sharding(text); } catch (const UserError&) {}
  return 0;
}
