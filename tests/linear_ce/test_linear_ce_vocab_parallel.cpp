// Vocabulary-parallel linear CE under mpirun -np 4: the weight is split over ranks, the (max, sum-exp, target logit)
// are combined through lcplan::comm, and every rank must reproduce the single-rank result it computes locally.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "kernels/linear_ce/linear_ce_vocab_parallel.h"
#include "tests/linear_ce/reference.h"

namespace lcplan::linear_ce {
namespace {

using test::Data;
using test::expect_rel;
using test::make_data;

std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

std::vector<float> decode(const std::vector<char>& raw, DType t) {
  std::vector<float> out;
  const size_t n = raw.size() / dtype_bytes(t);
  for (size_t k = 0; k < n; ++k)
    out.push_back(t == DType::BF16 ? bf16_to_float(reinterpret_cast<const bf16*>(raw.data())[k])
                                   : reinterpret_cast<const float*>(raw.data())[k]);
  return out;
}

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
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(LinearCeVocabParallel, MismatchedRanksFailOnEveryRank) {
  const comm::Comm c = comm::world_mpi();
  const Data d = make_data(16, 8, 40, DType::F32, 32);
  const VocabShard s = even_shard(d.v, c.rank, c.size);
  const float* w = d.w.data() + s.start * d.h;
  std::vector<float> loss(1), lse(d.n);
  auto fwd = [&](Problem p, const int64_t* tg) {
    return error_of([&] {
      forward_vocab_parallel_cpu(c, p, DType::F32, d.e.data(), w, tg, loss.data(), lse.data(), Options{});
    });
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
}

}  // namespace

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace lcplan::linear_ce

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one readable log: only rank 0 prints progress, every rank still prints its failures
    auto& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new lcplan::linear_ce::FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
