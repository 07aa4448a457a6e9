// --megatron-args / --megatron-args-file: a Megatron-LM launch as the plan `estimate` and `search` start from.
#include <cstdio>

#include "cli/plan_flags.h"
#include "common/data_dir.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "search/megatron_args.h"

namespace lcplan::cli {

StartingPoint starting_point(const PlanFlags& f, bool allow_lists) {
  StartingPoint s;
  if (f.megatron_args.empty() && f.megatron_args_file.empty()) {
    s.plan = plan_from_flags(f, allow_lists);
    return s;
  }
  if (!f.megatron_args.empty() && !f.megatron_args_file.empty())
    throw UserError("--megatron-args contradicts --megatron-args-file (give one launch)");
  if (!f.plan_file.empty())
    throw UserError(std::string("--plan contradicts ") + (f.megatron_args.empty() ? "--megatron-args-file" : "--megatron-args") +
                    " (give one plan to start from)");
  const MegatronLaunch l = f.megatron_args.empty()
                               ? parse_megatron_script(read_text_file(f.megatron_args_file, "Megatron launch script"),
                                                       f.megatron_args_file)
                               : parse_megatron_args(f.megatron_args);
  if (!f.model.empty()) {
    s.model = load_named_model(f.model, data_dir());
  } else if (l.model) {
    s.model = l.model;
  } else {
    std::string missing;
    for (const auto& m : l.missing_shape) missing += (missing.empty() ? "" : ", ") + m;
    throw UserError("the Megatron flags do not describe the model (missing " + missing +
                    "; give --model NAME, a zoo name or a config.json)");
  }
  const int gpus = f.gpus.empty() ? l.world_size : parse_positive_int(f.gpus, "--gpus");
  if (gpus == 0)
    throw UserError("no GPU count given (use --gpus N; the Megatron command has no WORLD_SIZE or --nnodes x --nproc-per-node)");
  std::vector<std::string> notes = l.notes;
  Plan p = finish_megatron_plan(l, *s.model, gpus, &notes);
  if (!f.model.empty()) p.model = f.model;  // the name as given, so that the recipe it becomes loads the same model
  s.plan = apply_plan_flags(p, f, allow_lists);
  s.from_megatron = true;
  s.global_batch_given = l.global_batch_given || !f.global_batch.empty();
  if (!l.ignored.empty()) {
    std::string list;
    for (const auto& x : l.ignored) list += (list.empty() ? "" : ", ") + x;
    s.warnings.push_back("ignored Megatron flags lcplan does not know: " + list);
  }
  for (const auto& n : notes) s.warnings.push_back(n);
  return s;
}

void print_warnings(const StartingPoint& s) {
  for (const auto& w : s.warnings) std::fprintf(stderr, "lcplan: warning: %s\n", w.c_str());
}

void require_loadable_model(const PlanFlags& f, const std::string& why) {
  const bool launch = !f.megatron_args.empty() || !f.megatron_args_file.empty();
  if (launch && f.model.empty())
    throw UserError(why + " needs a model lcplan can load again, and the Megatron-LM launch describes its model only by "
                          "shape flags (give --model: a zoo name or the model's config.json)");
}

}  // namespace lcplan::cli
