// How decoder layers split over the pp*vpp virtual pipeline stages. Megatron-LM's rules
// (megatron/core/transformer/transformer_block.py get_num_layers_to_build, https://github.com/NVIDIA/Megatron-LM):
//  - even: layers divisible by pp*vpp;
//  - embedding and loss: with --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split,
//    layers + 2 divisible, the first and last virtual stage one layer short;
//  - first/last: --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers give the first / last
//    stage its own count, the other stages share the rest evenly, and each stage's layers split evenly over its vpp
//    virtual stages;
//  - explicit: a layer count per virtual stage (what --pipeline-model-parallel-layout expresses).
// Without a request, a split neither even rule produces is balanced the way real runs do it (the first and last
// virtual stage count the embedding and the loss as one layer each and hold fewer layers).
// Virtual stage c runs on pipeline stage c % pp (interleaved schedule), as its (c / pp)-th chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lcplan {

// What the plan asks for; everything zero / empty = automatic.
struct PipelineLayout {
  int first_stage_layers = 0;      // decoder layers on pipeline stage 0 (Megatron --decoder-first-pipeline-num-layers)
  int last_stage_layers = 0;       // decoder layers on the last stage (--decoder-last-pipeline-num-layers)
  std::vector<int> chunk_layers;   // explicit decoder layers per virtual stage, pp*vpp entries in Megatron order
  bool empty() const { return first_stage_layers == 0 && last_stage_layers == 0 && chunk_layers.empty(); }
};

enum class SplitRule : uint8_t { Even, EmbeddingAndLoss, FirstLast, Explicit, Balanced };
const char* to_string(SplitRule r);

struct PipelineSplit {
  int pp = 1, vpp = 1;
  SplitRule rule = SplitRule::Even;
  std::vector<int> layers;  // decoder layers of each virtual stage, pp*vpp entries

  int chunks() const { return pp * vpp; }
  int layers_in(int chunk) const { return layers[chunk]; }
  int stage_of_chunk(int chunk) const { return chunk % pp; }
  int max_chunk_layers() const;  // the most layers one virtual stage holds
  int stage_layers(int stage) const;  // decoder layers of pipeline stage `stage` over all its virtual stages
};

// The split, or an empty `split` and one sentence in `error` naming the value and what would be valid.
struct SplitResult {
  bool ok = false;
  PipelineSplit split;
  std::string error;
};
SplitResult split_layers(int layers, int pp, int vpp, const PipelineLayout& want = {});

// Where each decoder layer lands, in layer order (one walk over the split).
struct LayerPlace {
  int stage = 0;   // pipeline stage (rank)
  int vchunk = 0;  // virtual chunk index on that stage
  int pos = 0;     // position inside its virtual stage (Megatron's block recompute counts from 0)
};
std::vector<LayerPlace> place_layers(const PipelineSplit& s);

}  // namespace lcplan
