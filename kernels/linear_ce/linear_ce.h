// Linear cross-entropy: loss = CE(hidden @ weight^T, targets) without ever materialising the [tokens x vocab] logits.
//
// Layouts (row-major): hidden [N x H], weight [V x H] (the LM head, as in nn.Linear), targets [N] (global vocab ids,
// or ignore_index). The forward streams vocabulary tiles and keeps a per-token fp32 (max, sum-exp) pair, merged tile
// by tile with lse_merge, plus the target logit; it returns the loss and the per-token lse, which the backward needs.
// The backward recomputes each logits tile, forms (softmax - onehot) * upstream grad and accumulates d_hidden and
// d_weight in fp32.
//
// Cost (N tokens, H hidden, V vocab): forward 2NHV FLOPs, backward 6NHV (recompute 2NHV + d_hidden 2NHV + d_weight
// 2NHV). Extra memory of the CPU path never grows with V: a logits tile, O(N) state, for bf16 inputs fp32 tiles of
// hidden and weight, and in the bf16 backward the fp32 [N x H] d_hidden accumulator (see cpu_extra_bytes_bound()).
//
// Vocabulary parallelism: each rank holds rows [vocab_start, vocab_start + vocab) of a vocab_total-row weight; the
// per-token max, sum-exp and target logit are combined with two all-reduces and d_hidden is summed across ranks.
// The core takes that all-reduce as a callback (CrossRankAllReduce) so it has no MPI dependency; the comm-backed
// wrapper lives in linear_ce_vocab_parallel.h. A shard without a callback is refused (it would be a partial loss).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/common/bf16.h"
#include "kernels/linear_ce/linear_ce_math.h"

namespace lcplan::linear_ce {

// The API takes bf16 tensors; re-export the project's bf16 so callers can write linear_ce::bf16.
using lcplan::bf16;
using lcplan::bf16_to_float;
using lcplan::float_to_bf16;
using lcplan::from_float;
using lcplan::round_bf16;
using lcplan::to_float;

enum class DType : uint8_t { F32, BF16 };

size_t dtype_bytes(DType t);
const char* to_string(DType t);
const char* to_string(Reduction r);

struct Options {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  float softcap = 0.0f;        // > 0: logits become softcap * tanh(logits / softcap)
  float z_loss = 0.0f;         // > 0: adds z_loss * lse^2 per token (PaLM-style auxiliary loss)
  int64_t vocab_tile = 2048;   // vocabulary rows per tile
  int64_t token_tile = 256;    // tokens per tile (bounds the logits tile to token_tile x vocab_tile)
};

// Shapes of one call. Under vocabulary parallelism `vocab` is this rank's row count of the weight.
struct Problem {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t vocab_start = 0;   // global id of weight row 0
  int64_t vocab_total = -1;  // global vocabulary size; -1 means `vocab` (single rank)

  int64_t total() const { return vocab_total < 0 ? vocab : vocab_total; }
};

// Explicit accounting of the scratch memory a call allocated (inputs and outputs excluded).
struct Stats {
  size_t peak_extra_bytes = 0;
};

enum class CrossRankOp : uint8_t { Sum, Max };
// In-place all-reduce of `count` floats across the vocabulary-parallel group; empty = single rank.
using CrossRankAllReduce = std::function<void(float* buf, size_t count, CrossRankOp op)>;

// Throws std::invalid_argument with one sentence naming the first bad field (sizes, tiles, options, shard bounds).
void validate(const Problem& p, const Options& o);
// True when `p` holds only part of the vocabulary (vocab_start != 0 or vocab_total != vocab).
bool is_shard(const Problem& p);
// Throws std::invalid_argument when `p` is a shard but no cross-rank all-reduce was given: the per-rank result
// would be a partial loss, silently wrong.
void validate_shard(const Problem& p, bool has_all_reduce);
// Throws std::invalid_argument naming the first target outside [0, vocab_total) that is not ignore_index.
void validate_targets(const Problem& p, const Options& o, const int64_t* targets);
int64_t count_valid(const int64_t* targets, int64_t n, int64_t ignore_index);

// Upper bound on the CPU path's extra bytes for any vocabulary size (the vocab is deliberately not an argument).
size_t cpu_extra_bytes_bound(int64_t tokens, int64_t hidden, DType t, const Options& o);

// Forward. loss: N floats for Reduction::None, else 1 float. lse: N floats, saved for the backward.
void forward_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets, float* loss,
                 float* lse, const Options& o, Stats* stats = nullptr, const CrossRankAllReduce& all_reduce = {});

// Backward. grad_loss: N floats for Reduction::None, else 1. d_hidden [N x H] and d_weight [vocab x H] have the
// input dtype and are overwritten. Under vocabulary parallelism d_hidden is summed over ranks (full gradient).
void backward_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                  const float* lse, const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                  Stats* stats = nullptr, const CrossRankAllReduce& all_reduce = {});

// Paired baseline: materialises the full [N x V] logits like a framework would (bf16 inputs: logits and their
// gradient rounded to bf16, as a bf16 matmul output would be). Same signatures; single rank only.
void forward_naive_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                       float* loss, float* lse, const Options& o, Stats* stats = nullptr);
void backward_naive_cpu(const Problem& p, DType t, const void* hidden, const void* weight, const int64_t* targets,
                        const float* lse, const float* grad_loss, void* d_hidden, void* d_weight, const Options& o,
                        Stats* stats = nullptr);

}  // namespace lcplan::linear_ce
