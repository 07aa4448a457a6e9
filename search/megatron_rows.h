// What the rows of the Megatron flag table (search/megatron_flags.h) work on, shared by the files that define rows:
// search/megatron_flags.cpp (layout, batch, optimizer, MoE, precision) and search/megatron_run_rows.cpp (the run
// settings of estimator/run_settings.h). Not for use outside search/.
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "search/megatron_args.h"
#include "search/megatron_flags.h"

namespace lcplan {

// Sources of every rule in the rows: Megatron-LM megatron/training/arguments.py (flags, defaults, validate_args) and
// megatron/core/transformer/transformer_config.py (__post_init__ checks).
struct MegatronReading {
  const MegatronFlagSet& f;
  MegatronLaunch& l;
  Plan& p;
  Parallel& q;
  const std::map<std::string, std::string>& env;
  int script_world_size;
};

struct MegatronFinishing {
  const MegatronLaunch& l;
  const ModelSpec& m;
  int layers;  // the model's decoder layers
  Plan& p;
  std::vector<std::string>* notes;
};

struct MegatronEmission {
  const Plan& p;
  const ModelSpec& m;
  bool moe;
  int layers;
  int mtp;  // MTP layers the plan trains
  SplitResult split;
  std::ostringstream flags;            // " --flag value" each
  std::vector<std::string> comments;   // "# ..." lines after the flags
  std::vector<std::string> no_flag;    // the fields of the "# no Megatron flag:" line
};

// A (field, value) pair as the round trip compares it: doubles to 17 digits, so that equal means equal.
template <typename T>
void add_value(FieldValues& v, const char* field, const T& value) {
  std::ostringstream o;
  o.precision(17);
  o << value;
  v.push_back({field, o.str()});
}

// The run-setting rows (search/megatron_run_rows.cpp), in the order they are emitted and read.
std::vector<MegatronRow> run_setting_rows();

}  // namespace lcplan
