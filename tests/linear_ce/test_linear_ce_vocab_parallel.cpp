// Vocabulary-parallel linear CE under mpirun -np 4: the weight is split over ranks, the (max, sum-exp, target logit)
// are combined through lcplan::comm, and every rank must reproduce the single-rank result it computes locally.
// main() is mpi_main.cpp (MPI_Init around the tests, one readable log).
#include <gtest/gtest.h>

#include <utility>

#include "kernels/linear_ce/linear_ce_vocab_parallel.h"
#include "tests/linear_ce/reference.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::decode;
using test::error_of;
using test::expect_rel;
using test::make_data;
using test::widen;

struct Shard {
  std::vector<float> loss, lse, dh, dw;
};

Shard run_shard(const comm::Comm& c, const Data& d, const Options& o) {
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const Problem p{d.n, d.h, s.size, s.start, d.v};
  const size_t es = dtype_bytes(d.dtype);
  const void* w = static_cast<const char*>(d.weight()) + s.start * d.h * es;
  Shard out;
  out.loss.assign(o.reduction == Reduction::None ? d.n : 1, 0.0f);
  out.lse.assign(d.n, 0.0f);
  forward_vocab_parallel_cpu(c, p, d.dtype, d.hidden(), w, d.targets.data(), out.loss.data(), out.lse.data(), o);
  const std::vector<float> one{1.0f};
  const float* g = o.reduction == Reduction::None ? d.grad.data() : one.data();
  std::vector<char> dh(d.n * d.h * es), dw(s.size * d.h * es);
  backward_vocab_parallel_cpu(c, p, d.dtype, d.hidden(), w, d.targets.data(), out.lse.data(), g, dh.data(), dw.data(),
                              o);
  out.dh = decode(dh, d.dtype);
  out.dw = decode(dw, d.dtype);
  return out;
}

void expect_matches_single_rank(DType t, Reduction r, float softcap, float zloss) {
  const comm::Comm c = comm::world_mpi();
  ASSERT_EQ(c.size, 4) << "run under mpirun -np 4";
  const Data d = make_data(252, 507, 1231, t, 31);  // 1231 rows split 308/308/308/307
  Options o;
  o.reduction = r;
  o.vocab_tile = 200;
  o.token_tile = 100;
  o.softcap = softcap;
  o.z_loss = zloss;
  const auto whole = test::run_cpu(d, o);  // every rank computes the single-rank answer itself
  const Shard mine = run_shard(c, d, o);
  // fp32: only the merge order differs; bf16: an output rounding may land on the other side of a bf16 step.
  const double tol = t == DType::F32 ? 1e-5 : 8e-3;
  expect_rel("loss", mine.loss, widen(whole.loss), 1e-5);
  expect_rel("lse", mine.lse, widen(whole.lse), 1e-5);
  expect_rel("d_hidden", mine.dh, widen(whole.dh), tol);
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const std::vector<float> dw_rows(whole.dw.begin() + s.start * d.h, whole.dw.begin() + (s.start + s.size) * d.h);
  expect_rel("d_weight shard", mine.dw, widen(dw_rows), tol);
}

TEST(LinearCeVocabParallel, Fp32MeanMatchesSingleRank) { expect_matches_single_rank(DType::F32, Reduction::Mean, 0, 0); }
TEST(LinearCeVocabParallel, Fp32NoneMatchesSingleRank) { expect_matches_single_rank(DType::F32, Reduction::None, 0, 0); }
TEST(LinearCeVocabParallel, Fp32SumSoftcapZLossMatchesSingleRank) {
  expect_matches_single_rank(DType::F32, Reduction::Sum, 15.0f, 1e-4f);
}
TEST(LinearCeVocabParallel, Bf16MeanMatchesSingleRank) { expect_matches_single_rank(DType::BF16, Reduction::Mean, 0, 0); }

// Every rank must throw (no rank may hang in a collective) when any one rank's input is wrong.
TEST(LinearCeVocabParallel, MismatchedRanksFailOnEveryRank) {
  const comm::Comm c = comm::world_mpi();
  const Data d = make_data(16, 8, 40, DType::F32, 32);
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const float* w = d.w.data() + s.start * d.h;
  std::vector<float> loss(1), lse(d.n);
  auto fwd = [&](Problem p, const int64_t* tg, const Options& o = Options{}) {
    return error_of(
        [&] { forward_vocab_parallel_cpu(c, p, DType::F32, d.e.data(), w, tg, loss.data(), lse.data(), o); });
  };
  // Rank 1 claims a different token count.
  std::string msg = fwd(Problem{c.rank == 1 ? d.n - 1 : d.n, d.h, s.size, s.start, d.v}, d.targets.data());
  EXPECT_NE(msg.find("disagree on tokens"), std::string::npos) << msg;
  // Rank 2's shard leaves a gap.
  msg = fwd(Problem{d.n, d.h, s.size, s.start + (c.rank == 2 ? 1 : 0), d.v}, d.targets.data());
  EXPECT_NE(msg.find("shard"), std::string::npos) << msg;
  // Rank 3 has an out-of-range target: it reports the target, the others name rank 3.
  std::vector<int64_t> bad = d.targets;
  if (c.rank == 3) bad[5] = 1000;
  msg = fwd(Problem{d.n, d.h, s.size, s.start, d.v}, bad.data());
  if (c.rank == 3) EXPECT_NE(msg.find("target[5] = 1000"), std::string::npos) << msg;
  else EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
  // Shards that do not add up to vocab_total.
  msg = fwd(Problem{d.n, d.h, s.size, s.start, d.v + 5}, d.targets.data());
  EXPECT_NE(msg.find("cover"), std::string::npos) << msg;
  // Options every rank must share: one rank differs in each, in turn.
  const Problem p{d.n, d.h, s.size, s.start, d.v};
  const std::pair<const char*, void (*)(Options&)> options[] = {
      {"softcap", [](Options& o) { o.softcap = 30.0f; }},
      {"z_loss", [](Options& o) { o.z_loss = 1e-4f; }},
      {"vocab_tile", [](Options& o) { o.vocab_tile = 64; }},
      {"token_tile", [](Options& o) { o.token_tile = 8; }},
  };
  for (const auto& [name, change] : options) {
    Options o;
    if (c.rank == 1) change(o);
    msg = fwd(p, d.targets.data(), o);
    EXPECT_NE(msg.find(std::string("disagree on ") + name), std::string::npos) << name << ": " << msg;
  }
  // The dtype is not an Options field but must agree as well (bf16 weight rows on one rank, fp32 on the others).
  const Data b = make_data(16, 8, 40, DType::BF16, 32);
  msg = error_of([&] {
    if (c.rank == 2)
      forward_vocab_parallel_cpu(c, p, DType::BF16, b.hidden(), b.w16.data() + s.start * b.h, d.targets.data(),
                                 loss.data(), lse.data(), Options{});
    else
      forward_vocab_parallel_cpu(c, p, DType::F32, d.e.data(), w, d.targets.data(), loss.data(), lse.data(), Options{});
  });
  EXPECT_NE(msg.find("disagree on dtype"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lcplan::linear_ce
