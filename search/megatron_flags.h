// The Megatron-LM flag table: one row per plan field Megatron-LM (or Megatron-Bridge) has flags for, naming the
// flags, how lcplan reads them (search/megatron_args.h) and how it emits them (megatron_flags below), and the plan
// fields Megatron has no flag for. Flag names and rules are Megatron-LM's (megatron/training/arguments.py,
// megatron/core/transformer/transformer_config.py, https://github.com/NVIDIA/Megatron-LM). README "Megatron-LM
// interop" mirrors the table (tests/interop/megatron_flags_test.cpp checks that they agree).
//
// Adding a plan field Megatron has a flag for is one row: its flags, a reader (flags -> plan, Megatron's
// contradictions as one sentence each), an emitter (plan -> flags), the values the round trip compares, lcplan's own
// flag for estimate / search / report when it is a run setting, and, when the flag needs the model or the GPU count
// to mean something, a finisher.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"

namespace lcplan {

struct MegatronLaunch;  // search/megatron_args.h

enum class Arity { Switch, One, List };

struct MegatronFlag {
  const char* name;  // "--tensor-model-parallel-size"
  Arity arity;
  // Megatron-Bridge's config field when it is not the flag's name with '_' for '-' ("num_moe_experts"); a leading
  // '!' marks a field that is the switch's negation (share_embeddings_and_output_weights=false is
  // --untie-embeddings-and-output-weights).
  const char* bridge = nullptr;
};

enum class Fidelity {
  Exact,        // the emitted flags read back to the same field (tests/interop round trip)
  Approximate,  // read, but modelled coarser than Megatron runs it (the row's note says how)
  NoFlag,       // a plan field Megatron has no flag for (the row's note says why); emitted as a comment line
};

// lcplan's flag for a row's field on estimate, search and report (cli/plan_flags.cpp adds one option per entry, in
// table order). `apply` sets the field from the flag's text, marks it given (Plan::assumed) and throws one UserError
// sentence naming the flag and what is valid.
struct LcplanFlag {
  const char* name;  // "--grad-dtype"
  const char* help;
  void (*apply)(Plan&, const std::string& text);
};

// What a row's functions work on (defined in megatron_flags.cpp).
struct MegatronReading;    // the launch's flags -> MegatronLaunch (before the model is known)
struct MegatronFinishing;  // MegatronLaunch + the model + the GPU count -> Plan
struct MegatronEmission;   // Plan -> flags and comment lines
using FieldValues = std::vector<std::pair<std::string, std::string>>;  // (field, value) as the round trip compares

struct MegatronRow {
  const char* field;  // the plan field(s): "parallel.tp", "recompute, recompute_layers"; "(...)" when none yet
  std::vector<MegatronFlag> flags = {};
  Fidelity fidelity;
  const char* note;  // Approximate / NoFlag: one sentence; "" for Exact
  void (*read)(MegatronReading&) = nullptr;
  void (*finish)(MegatronFinishing&) = nullptr;
  void (*emit)(MegatronEmission&) = nullptr;
  void (*expressed)(const Plan&, FieldValues&) = nullptr;  // the plan's values of the row's fields
  std::vector<LcplanFlag> lcplan = {};                     // lcplan's flags for the row's fields (none: the CLI's own)
};

// The table, in the order flags are emitted and read.
const std::vector<MegatronRow>& megatron_rows();
// A flag of the table (nullptr: lcplan does not read it).
const MegatronFlag* find_megatron_flag(const std::string& name);
// The flag a Megatron-Bridge config field mirrors, or nullptr for a field no row names.
const MegatronFlag* find_bridge_field(const std::string& field);
// Megatron flags that change nothing lcplan models (schedule, data, logging, checkpoints, fused kernels the
// calibration profile stands for): accepted silently.
bool megatron_flag_without_effect(const std::string& name);
const std::vector<std::string>& megatron_flags_without_effect();
// The flags a Megatron-Bridge mixed_precision recipe name sets (src/megatron/bridge/training/mixed_precision.py).
std::vector<std::pair<std::string, std::vector<std::string>>> bridge_mixed_precision_flags(const std::string& recipe);

// The flags of one launch with Megatron's argparse semantics: the last occurrence of a flag wins (noted). The
// accessors check the value and throw one UserError sentence naming the flag.
class MegatronFlagSet {
 public:
  explicit MegatronFlagSet(std::vector<std::string>& notes) : notes_(notes) {}
  void set(const std::string& name, std::vector<std::string> values);
  // The single value as written, unchecked (nothing when absent, valueless or given several values).
  std::optional<std::string> raw(const std::string& name) const;
  bool has(const std::string& name) const { return map_.count(name) > 0; }
  bool on(const std::string& name) const;  // a switch
  std::optional<std::string> text(const std::string& name) const;
  std::optional<std::vector<std::string>> list(const std::string& name) const;
  std::optional<int> integer(const std::string& name, int lo) const;
  std::optional<double> number(const std::string& name, double lo, double hi, const std::string& valid) const;
  std::optional<std::string> choice(const std::string& name, const std::vector<std::string>& valid) const;

 private:
  std::map<std::string, std::vector<std::string>> map_;
  std::vector<std::string>& notes_;
};

// True for text the shell left unexpanded ($VAR, `cmd`): a value that needs it cannot be read.
bool unresolved_text(const std::string& v);
std::string join_words(const std::vector<std::string>& v, const std::string& sep = " ");
// A launcher's count (WORLD_SIZE, --nnodes, --nproc-per-node): a whole number of 1 or more; `what` names it in the error.
int launcher_count(const std::string& text, const std::string& what);

// Every row's reader, in table order, into `l` (its plan, pending fields and notes). `env`: the environment words
// in front of the command; `script_world_size`: WORLD_SIZE as a script set it (0: not set).
void read_megatron_rows(const MegatronFlagSet& f, const std::map<std::string, std::string>& env, int script_world_size,
                        MegatronLaunch& l);
// Every row's finisher, in table order: the plan of the launch for `m` (already in `p` with gpus and model set).
void finish_megatron_rows(const MegatronLaunch& l, const ModelSpec& m, Plan& p, std::vector<std::string>* notes);

// Megatron-LM flags for the plan (flag names as of Megatron-Core 0.12+; check them against your version), then
// comment lines naming what has no flag.
std::string megatron_flags(const Plan& p, const ModelSpec& m);

// Plan equality over the fields a Megatron-LM command line expresses (every row's `expressed` values, the round trip
// of README "Megatron-LM interop"); fields without a flag (model, hardware, gpus, gpus_per_node, implementation,
// routing_imbalance, ep_chunks) are not compared. Returns "" when equal, else the first differing field and both
// values ("precision: bf16 vs fp8").
std::string megatron_plan_difference(const Plan& a, const Plan& b);

}  // namespace lcplan
