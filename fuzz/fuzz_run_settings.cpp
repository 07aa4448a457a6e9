// Fuzz target: the run settings (estimator/run_settings.h) as a recipe's keys, read on top of a fixed MoE plan, then
// resolved to the implementation's defaults, judged by the plan rules and the frameworks' capability tables, and,
// where the framework launches Megatron-LM flags, emitted and read back by the flag table's run-setting rows
// (search/megatron_run_rows.cpp). Valid or UserError; for a plan its framework runs: estimates finite and
// non-negative, and the flags read back to the same plan (megatron_plan_difference empty).
#include <cstdint>

#include "common/data_dir.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/frameworks.h"
#include "estimator/plan_rules.h"
#include "fuzz/fuzz_util.h"
#include "models/zoo.h"
#ifdef LCPLAN_HAVE_SEARCH
#include "search/megatron_args.h"
#endif

namespace {

using namespace lcplan;

// The keys a recipe's run settings live under; anything else in the input is dropped, so that the fuzzer explores
// the settings rather than the layout.
const char* const kSettingKeys[] = {"recompute", "recompute_layers", "recompute_method", "recompute_modules", "offload",
                                    "moe", "optimizer", "fp8", "cuda_graphs", "comm", "implementation", "precision",
                                    "optimizer_sharding", "pipeline", "sequence_parallel",
                                    "distribute_saved_activations"};

nlohmann::json base_plan() {
  return {{"model", "qwen3-30b-a3b"}, {"gpus", 16}, {"seq_len", 4096}, {"hardware", "b200"},
          {"parallel", {{"tp", 2}, {"pp", 2}, {"vpp", 2}, {"cp", 2}, {"ep", 4}}}, {"global_batch", 32}};
}

void check_estimate(const ModelSpec& m, const Plan& p, const Hardware& hw, const Calibration& cal) {
  const Estimate e = estimate(m, p, hw, cal);
  fuzz::require(fuzz::finite_nonneg(e.memory.peak_bytes) && e.memory.peak_bytes > 0, "peak memory finite and positive");
  fuzz::require(fuzz::finite_nonneg(e.time.step_seconds) && e.time.step_seconds > 0, "step time finite and positive");
  for (const StageMemory& st : e.memory.stages)
    for (const MemoryCategoryInfo& c : kMemoryCategories)
      fuzz::require(fuzz::finite_nonneg(st.breakdown.*c.member), "memory terms finite and non-negative");
}

#ifdef LCPLAN_HAVE_SEARCH
// Megatron-LM flags of a plan its framework runs read back to the same plan.
void check_round_trip(const ModelSpec& m, const Plan& p) {
  const Framework* fw = find_framework(p.implementation);
  if (!fw || std::string(fw->launch) != "megatron") return;
  Plan back;
  try {
    back = finish_megatron_plan(parse_megatron_args(megatron_flags(p, m)), m, p.gpus);
  } catch (const UserError&) {
    fuzz::require(false, "the flags emitted for a valid plan read back without an error");
  }
  fuzz::require(megatron_plan_difference(p, back).empty(), "emitted flags read back to the same plan");
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelSpec model = load_model("qwen3-30b-a3b", data_dir());
  static const Hardware hw = load_hardware("b200", data_dir());
  static const Calibration profile = load_calibration("default", data_dir());
  const auto j = fuzz::parse_json(data, size);
  if (!j || !j->is_object()) return 0;
  nlohmann::json recipe = base_plan();
  for (const char* key : kSettingKeys)
    if (j->contains(key)) recipe[key] = j->at(key);
  Plan p;
  try {
    p = plan_from_json(recipe);
    if (!find_framework(p.implementation)) return 0;  // a profile's own implementation: nothing to look up
    const Calibration cal = calibration_for(profile, hw, p.implementation);
    resolve_run_defaults(p, model, cal);
    fuzz::require(p.assumed == 0, "resolution leaves no setting unset");
    if (check_plan(model, p) || !framework_support_error(model, p).empty()) return 0;
    check_estimate(model, p, hw, cal);
  } catch (const UserError&) {
    return 0;
  }
#ifdef LCPLAN_HAVE_SEARCH
  check_round_trip(model, p);
#endif
  return 0;
}
