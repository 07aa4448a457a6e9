// Fuzz target: Megatron-LM command text and launch scripts (parse_megatron_args, parse_megatron_script) -> a plan.
// Valid or UserError; ignored flags are listed once each; a launch whose shape flags build a model finishes into a
// plan for its GPU count, and when that plan is valid, the flags lcplan emits for it read back to the same plan
// (megatron_plan_difference), or are refused with a UserError (Megatron's own rules are stricter than lcplan's).
#include <cstdint>
#include <set>
#include <string>

#include "common/user_error.h"
#include "estimator/plan_rules.h"
#include "fuzz/fuzz_util.h"
#include "search/emit.h"
#include "search/megatron_args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  if (size > 1 << 16) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int script = 0; script < 2; ++script) {
    MegatronLaunch l;
    try {
      l = script ? parse_megatron_script(text, "fuzz.sh") : parse_megatron_args(text);
    } catch (const UserError&) {
      continue;
    }
    fuzz::require(std::set<std::string>(l.ignored.begin(), l.ignored.end()).size() == l.ignored.size(),
                  "each ignored flag is listed once");
    if (!l.model) continue;
    fuzz::require(!l.model->layers.empty() && l.model->hidden > 0 && l.model->vocab > 0, "a model from flags has a shape");
    if (l.model->layers.size() > 512 || l.model->hidden > (1 << 16)) continue;  // keep each input fast
    Plan p;
    try {
      p = finish_megatron_plan(l, *l.model, l.world_size > 0 ? l.world_size : 8);
    } catch (const UserError&) {
      continue;
    }
    if (check_plan(*l.model, p)) continue;
    Plan back;
    try {
      back = finish_megatron_plan(parse_megatron_args(megatron_flags(p, *l.model)), *l.model, p.gpus);
    } catch (const UserError&) {
      continue;
    }
    fuzz::require(megatron_plan_difference(p, back).empty(), "emitted Megatron flags read back to the same plan");
  }
  return 0;
}
