// Megatron-LM command lines in: the flags of a Megatron-LM launch (megatron/training/arguments.py,
// https://github.com/NVIDIA/Megatron-LM) read into a Plan, plus a ModelSpec when the model-shape flags describe one.
//
// Reading happens in two steps because some flags only mean something once the model and the GPU count are known
// (--num-layers-per-virtual-pipeline-stage needs the layer count, the default --global-batch-size is
// micro batch x dp, the default expert TP is TP on MoE models):
//   parse_megatron_args / parse_megatron_script -> MegatronLaunch (pure, no files)
//   finish_megatron_plan(launch, model, gpus)   -> Plan (Megatron's rules checked, one sentence per contradiction)
//
// Megatron's own defaults apply where a flag is absent (no distributed optimizer, no sequence parallelism, bf16
// only with --bf16), not lcplan's. Flags lcplan does not know are listed in `ignored`, each once; flags it reads
// approximately get one sentence in `notes`. Which flags are read and how is the table of search/megatron_flags.h
// (README "Megatron-LM interop" has it in words).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "estimator/plan.h"
#include "models/model_spec.h"
#include "search/megatron_flags.h"

namespace lcplan {

struct MegatronLaunch {
  Plan plan;                       // every field the flags set; the rest at Megatron's defaults (finished later)
  std::optional<ModelSpec> model;  // from the model-shape flags when they are complete (layers, hidden, heads, vocab)
  std::vector<std::string> missing_shape;  // shape flags a model from flags would still need (empty when `model`)
  int world_size = 0;              // WORLD_SIZE, or torchrun --nnodes x --nproc-per-node (0: not given)
  bool global_batch_given = false;
  std::vector<std::string> ignored;  // flags lcplan does not know, in order of appearance, each once
  std::vector<std::string> notes;    // one sentence per flag read approximately or without effect

  // Pending until the model is known (finish_megatron_plan).
  int layers_per_virtual_stage = 0;  // --num-layers-per-virtual-pipeline-stage
  int virtual_stages = 0;            // --num-virtual-stages-per-pipeline-rank
  std::vector<int> layout_layers;    // --pipeline-model-parallel-layout: decoder layers per virtual stage
  int layout_mtp = 0;                // MTP layers in the layout (its last stage)
  std::string layout_text;
  bool account_embedding = false, account_loss = false;
  bool etp_given = false;
  int cpu_offloading_layers = -1;    // --cpu-offloading-num-layers (-1: not given)
  // Shape flags, checked against a model given by name (0: not given).
  int num_layers = 0, hidden = 0, num_experts = 0, top_k = 0, mtp_layers = -1, moe_latent = 0;
};

// A command line or a list of flags (quotes, `\` continuations, --flag=value and --flag value, a launcher such as
// torchrun in front). Megatron-Bridge overrides (model.tensor_model_parallel_size=2, mixed_precision=<recipe>) are
// read as the Megatron flags they set. Throws UserError for a contradiction among the flags or a bad value.
MegatronLaunch parse_megatron_args(const std::string& text);
// A launch script: the first command running a pretrain_*.py or torchrun, with the script's variables expanded.
MegatronLaunch parse_megatron_script(const std::string& script, const std::string& name);
// The words of a command (already split), e.g. from shell_words.
// `script_world_size`: WORLD_SIZE as a script set it (0: not set).
MegatronLaunch parse_megatron_words(const std::vector<std::string>& words, int script_world_size = 0);

// The plan of the launch for the model it trains and its GPU count: virtual stages, the pipeline split (a layout
// or the account-for flags become explicit layers per virtual stage unless they equal lcplan's automatic split),
// expert TP (Megatron's default: TP), global batch (Megatron's default: micro batch x dp). Checks the layout and
// the shape flags against the model. Throws UserError naming the flags.
// Sentences about flags read approximately at this step are appended to `notes` when given.
Plan finish_megatron_plan(const MegatronLaunch& launch, const ModelSpec& model, int gpus,
                          std::vector<std::string>* notes = nullptr);

// The layers per virtual stage a --pipeline-model-parallel-layout string gives ("Et|(tt|)*30mL"), its MTP layers,
// and checks: E only at the start of the first stage, L only at the end of the last, m only in the last.
struct ParsedLayout {
  std::vector<int> layers;
  int mtp = 0;
};
ParsedLayout parse_pipeline_layout(const std::string& layout);

// Megatron-LM flags of a model: dense GQA and MLA decoders, MoE with --moe-layer-freq. Returns "" for models
// Megatron-LM's flags cannot describe (gated DeltaNet / sliding-window layers): use the model's Megatron-Bridge
// provider for those. `with_mtp` false leaves --mtp-num-layers to the plan's flags (megatron_flags emits it).
std::string megatron_model_flags(const ModelSpec& m, bool with_mtp = true);

// megatron_plan_difference (search/megatron_flags.h) compares two plans over the fields the flags express.

}  // namespace lcplan
