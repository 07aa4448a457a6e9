// Validation, small helpers and the memory bound shared by every linear CE implementation.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/linear_ce/linear_ce.h"

namespace lcplan::linear_ce {

size_t dtype_bytes(DType t) { return t == DType::BF16 ? 2 : 4; }
const char* to_string(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }
const char* to_string(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

namespace {
[[noreturn]] void bad(const std::string& s) { throw std::invalid_argument("linear_ce: " + s); }
}  // namespace

void validate(const Problem& p, const Options& o) {
  if (p.tokens < 0) bad("tokens must be >= 0, got " + std::to_string(p.tokens) + ".");
  if (p.hidden <= 0) bad("hidden must be > 0, got " + std::to_string(p.hidden) + ".");
  if (p.vocab <= 0) bad("vocab (rows of this rank's weight) must be > 0, got " + std::to_string(p.vocab) + ".");
  if (p.vocab_start < 0) bad("vocab_start must be >= 0, got " + std::to_string(p.vocab_start) + ".");
  if (p.vocab_total >= 0 && p.vocab_start + p.vocab > p.vocab_total)
    bad("the shard [" + std::to_string(p.vocab_start) + ", " + std::to_string(p.vocab_start + p.vocab) +
        ") does not fit in vocab_total " + std::to_string(p.vocab_total) + ".");
  if (p.vocab_total < 0 && p.vocab_start != 0) bad("vocab_start is set but vocab_total is not.");
  if (o.vocab_tile <= 0) bad("vocab_tile must be > 0, got " + std::to_string(o.vocab_tile) + ".");
  if (o.token_tile <= 0) bad("token_tile must be > 0, got " + std::to_string(o.token_tile) + ".");
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) bad("softcap must be a finite value >= 0 (0 disables it).");
  if (!(o.z_loss >= 0.0f) || !std::isfinite(o.z_loss)) bad("z_loss must be a finite value >= 0 (0 disables it).");
}

bool is_shard(const Problem& p) { return p.vocab_start != 0 || p.total() != p.vocab; }

void validate_shard(const Problem& p, bool has_all_reduce) {
  if (is_shard(p) && !has_all_reduce)
    bad("vocab_start = " + std::to_string(p.vocab_start) + " and vocab_total = " + std::to_string(p.total()) +
        " describe a vocabulary shard of " + std::to_string(p.vocab) +
        " rows but no cross-rank all-reduce was given (use the vocabulary-parallel entry point).");
}

void validate_targets(const Problem& p, const Options& o, const int64_t* targets) {
  if (p.tokens > 0 && targets == nullptr) bad("targets is null but tokens > 0.");
  const int64_t v = p.total();
  for (int64_t i = 0; i < p.tokens; ++i) {
    const int64_t t = targets[i];
    if (t != o.ignore_index && (t < 0 || t >= v))
      bad("target[" + std::to_string(i) + "] = " + std::to_string(t) + " is outside [0, " + std::to_string(v) +
          ") and is not ignore_index " + std::to_string(o.ignore_index) + ".");
  }
}

int64_t count_valid(const int64_t* targets, int64_t n, int64_t ignore_index) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += is_ignored(targets[i], ignore_index) ? 0 : 1;
  return c;
}

size_t cpu_extra_bytes_bound(int64_t tokens, int64_t hidden, DType t, const Options& o) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(tokens, 0));
  const size_t h = static_cast<size_t>(hidden);
  const size_t nt = std::min<size_t>(static_cast<size_t>(o.token_tile), std::max<size_t>(n, 1));
  const size_t vt = static_cast<size_t>(o.vocab_tile);
  const bool b = t == DType::BF16;
  // Forward: m, s, target logit, cross-rank max (4N) + logits tile + (bf16) fp32 tiles of hidden and weight.
  const size_t fwd = 4 * n + nt * vt + (b ? nt * h + vt * h : 0);
  // Backward: upstream grads (N) + logits tile + (bf16) fp32 hidden and weight tiles, the d_weight tile accumulator
  // and the [N x H] d_hidden accumulator (fp32 outputs accumulate in place).
  const size_t bwd = n + nt * vt + (b ? nt * h + vt * h + vt * h + n * h : 0);
  return sizeof(float) * std::max(fwd, bwd);
}

}  // namespace lcplan::linear_ce
