// Fuzz target: Hugging Face config.json text -> ModelSpec. Valid or UserError; any model it accepts must have
// finite, non-negative parameter counts and a plan check that runs without crashing.
#include <cstdint>
#include <string>

#include "estimator/plan_rules.h"
#include "fuzz/fuzz_util.h"
#include "models/hf_config.h"
#include "models/params.h"
#include "common/user_error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lcplan;
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelSpec m;
  try {
    m = model_from_hf_config_text(text, "fuzz/config.json");
  } catch (const UserError&) {
    return 0;
  }
  fuzz::require(!m.layers.empty() && m.hidden > 0 && m.vocab > 0, "accepted model has layers, hidden and vocab");
  const ParamCounts c = count_params(m);
  fuzz::require(fuzz::finite_nonneg(c.total) && fuzz::finite_nonneg(c.active) && c.active <= c.total * (1 + 1e-12),
                "parameter counts finite, non-negative, active <= total");
  Plan p;
  p.model = m.name;
  p.gpus = 8;
  p.seq_len = 8192;
  p.parallel.tp = 2;
  (void)check_plan(m, p);  // must not crash on any accepted model
  return 0;
}
