// How decoder layers split over the pp*vpp virtual pipeline stages, following Megatron-LM's two rules:
// layers divisible by pp*vpp, or (with --account-for-embedding-in-pipeline-split and
// --account-for-loss-in-pipeline-split) layers + 2 divisible, the first and last virtual stage holding one layer
// fewer because the embedding and the loss each count as a layer. Chunk c runs on stage c % pp (interleaved).
#pragma once

#include <optional>

namespace lcplan {

struct PipelineSplit {
  int pp = 1, vpp = 1;
  int chunks = 1;           // pp * vpp virtual stages
  int per_chunk = 0;        // layers of a middle virtual stage
  bool edge_short = false;  // first and last virtual stage hold per_chunk - 1 layers

  int start(int c) const { return edge_short && c > 0 ? per_chunk - 1 + (c - 1) * per_chunk : c * per_chunk; }
  int layers_in(int c) const { return per_chunk - (edge_short && (c == 0 || c == chunks - 1) ? 1 : 0); }
  int chunk_of(int layer) const {
    if (!edge_short) return layer / per_chunk;
    if (layer < per_chunk - 1) return 0;
    const int c = 1 + (layer - (per_chunk - 1)) / per_chunk;
    return c < chunks ? c : chunks - 1;
  }
  int stage_of(int layer) const { return chunk_of(layer) % pp; }
  int vchunk_of(int layer) const { return chunk_of(layer) / pp; }
  int pos_in_chunk(int layer) const { return layer - start(chunk_of(layer)); }
};

// Nothing when neither rule splits `layers` over pp*vpp with at least one layer per virtual stage.
inline std::optional<PipelineSplit> split_layers(int layers, int pp, int vpp) {
  if (pp < 1 || vpp < 1 || layers < 1) return std::nullopt;
  PipelineSplit s;
  s.pp = pp;
  s.vpp = vpp;
  s.chunks = pp * vpp;
  if (layers % s.chunks == 0) {
    s.per_chunk = layers / s.chunks;
    return s;
  }
  if (s.chunks > 2 && (layers + 2) % s.chunks == 0 && (layers + 2) / s.chunks >= 2) {
    s.per_chunk = (layers + 2) / s.chunks;
    s.edge_short = true;
    return s;
  }
  return std::nullopt;
}

}  // namespace lcplan
