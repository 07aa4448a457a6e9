// Vocabulary parallelism: the CPU linear CE with its cross-rank hook bound to lcplan::comm all-reduces.
#include "kernels/linear_ce/linear_ce_vocab_parallel.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace lcplan::linear_ce {

VocabShard even_shard(int64_t vocab_total, int rank, int ranks) {
  if (ranks <= 0 || rank < 0 || rank >= ranks || vocab_total < ranks)
    throw std::invalid_argument("linear_ce: even_shard needs 0 <= rank < ranks <= vocab_total.");
  const int64_t base = vocab_total / ranks, extra = vocab_total % ranks;
  return VocabShard{rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

CrossRankAllReduce comm_all_reduce(const comm::Comm& c) {
  return [&c](float* buf, size_t count, CrossRankOp op) {
    comm::all_reduce(c, buf, count, comm::DType::F32, op == CrossRankOp::Max ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  };
}

namespace {

// Bit pattern of a float option, so "same value" means bit-identical (what the combine relies on).
int64_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

void check_vocab_parallel(const comm::Comm& c, const Problem& p, DType t, const Options& o, const int64_t* targets) {
  std::string local_error;
  try {
    if (p.vocab_total < 0) throw std::invalid_argument("linear_ce: vocab_total must be set under vocabulary parallelism.");
    validate(p, o);
    validate_targets(p, o, targets);
  } catch (const std::invalid_argument& e) {
    local_error = e.what();
  }
  // A position-weighted checksum so two ranks with different targets (not just permuted) are caught.
  int64_t sum = 0;
  if (local_error.empty())
    for (int64_t i = 0; i < p.tokens; ++i) sum += (i % 1021 + 1) * (targets[i] + 7);
  enum Field { kOk, kTokens, kHidden, kVocabTotal, kStart, kVocab, kReduction, kIgnore, kTargets, kDType, kSoftcap,
               kZLoss, kVocabTile, kTokenTile, kFields };
  const int64_t mine[kFields] = {local_error.empty() ? 1 : 0, p.tokens, p.hidden, p.vocab_total, p.vocab_start,
                                 p.vocab, static_cast<int64_t>(o.reduction), o.ignore_index, sum,
                                 static_cast<int64_t>(t), bits_of(o.softcap), bits_of(o.z_loss), o.vocab_tile,
                                 o.token_tile};
  constexpr const char* names[kFields] = {"", "tokens", "hidden", "vocab_total", "", "", "reduction", "ignore_index",
                                          "targets", "dtype", "softcap", "z_loss", "vocab_tile", "token_tile"};
  // The check exchanges host values, so it runs over the MPI side even for a NCCL communicator (whose mpi handle
  // is always valid and spans the same ranks).
  comm::Comm host = c;
  host.backend = comm::Backend::Mpi;
  std::vector<int64_t> all(static_cast<size_t>(kFields) * c.size);
  comm::all_gather(host, mine, all.data(), kFields, comm::DType::I64);
  if (!local_error.empty()) throw std::invalid_argument(local_error);
  auto field = [&](int r, int f) { return all[static_cast<size_t>(r) * kFields + f]; };
  int64_t next = 0;
  for (int r = 0; r < c.size; ++r) {
    if (field(r, kOk) == 0)
      throw std::invalid_argument("linear_ce: rank " + std::to_string(r) + " passed invalid input (see its error).");
    for (int f : {kTokens, kHidden, kVocabTotal, kReduction, kIgnore, kTargets, kDType, kSoftcap, kZLoss, kVocabTile,
                  kTokenTile})
      if (field(r, f) != field(0, f))
        throw std::invalid_argument(std::string("linear_ce: ranks 0 and ") + std::to_string(r) + " disagree on " +
                                    names[f] + ".");
    if (field(r, kStart) != next)
      throw std::invalid_argument("linear_ce: rank " + std::to_string(r) + "'s shard starts at " +
                                  std::to_string(field(r, kStart)) + " but the previous shards end at " +
                                  std::to_string(next) + ".");
    next += field(r, kVocab);
  }
  if (next != p.vocab_total)
    throw std::invalid_argument("linear_ce: the shards cover " + std::to_string(next) + " rows but vocab_total is " +
                                std::to_string(p.vocab_total) + ".");
}

void forward_vocab_parallel_cpu(const comm::Comm& c, const Problem& p, DType t, const void* hidden, const void* weight,
                                const int64_t* targets, float* loss, float* lse, const Options& o, Stats* stats) {
  check_vocab_parallel(c, p, t, o, targets);
  forward_cpu(p, t, hidden, weight, targets, loss, lse, o, stats, comm_all_reduce(c));
}

void backward_vocab_parallel_cpu(const comm::Comm& c, const Problem& p, DType t, const void* hidden,
                                 const void* weight, const int64_t* targets, const float* lse, const float* grad_loss,
                                 void* d_hidden, void* d_weight, const Options& o, Stats* stats) {
  check_vocab_parallel(c, p, t, o, targets);
  backward_cpu(p, t, hidden, weight, targets, lse, grad_loss, d_hidden, d_weight, o, stats, comm_all_reduce(c));
}

}  // namespace lcplan::linear_ce
