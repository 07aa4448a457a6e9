// block_table, chunk_layout, etp_by_block, etp_rows (moe_layer.h): the per-chunk bookkeeping of the MoE layers, pure
// host code.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_math.h"

namespace lcplan::moe {

BlockTable block_table(const std::vector<int64_t>& by_block, int P, int L) {
  if (by_block.size() != size_t(P) * size_t(L))
    throw std::invalid_argument("block_table: " + std::to_string(by_block.size()) + " counts for " + std::to_string(P) +
                                " sources x " + std::to_string(L) + " experts");
  BlockTable t;
  t.expert_off.assign(size_t(L) + 1, 0);
  for (int e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int q = 0; q < P; ++q) n += by_block[size_t(q) * L + e];
    t.expert_off[size_t(e) + 1] = t.expert_off[size_t(e)] + n;
  }
  for (int q = 0; q < P; ++q)
    for (int e = 0; e < L; ++e) {
      const int64_t n = by_block[size_t(q) * L + e];
      if (!n) continue;
      t.blocks.push_back(block_offset_src_major(by_block.data(), P, L, q, e));
      t.blocks.push_back(block_offset_expert_major(by_block.data(), P, L, q, e));
      t.blocks.push_back(n);
      t.max_block_rows = std::max(t.max_block_rows, n);
    }
  return t;
}

ChunkLayout chunk_layout(const std::vector<int64_t>& counts_send, const std::vector<int64_t>& counts_recv, int P,
                         int rank, int N, int L, int H, int ch) {
  const size_t need = size_t(P) * size_t(N) * size_t(L);
  if (counts_send.size() != need || counts_recv.size() != need || ch < 0 || ch >= N)
    throw std::invalid_argument("chunk_layout: counts hold " + std::to_string(counts_send.size()) + " and " +
                                std::to_string(counts_recv.size()) + " values for " + std::to_string(P) +
                                " peers x " + std::to_string(N) + " chunks x " + std::to_string(L) +
                                " experts, chunk " + std::to_string(ch));
  ChunkLayout b;
  b.send_counts.assign(P, 0);
  b.send_displs.assign(P, 0);
  b.recv_counts.assign(P, 0);
  b.recv_displs.assign(P, 0);
  b.recv_by_block.assign(size_t(P) * L, 0);
  auto at = [&](int q, int e) { return (size_t(q) * N + ch) * L + e; };
  for (int q = 0; q < P; ++q) {
    b.send_displs[q] = size_t(b.rows_sent) * H;
    b.recv_displs[q] = size_t(b.rows_received) * H;
    int64_t sent = 0, got = 0;
    for (int e = 0; e < L; ++e) {
      sent += counts_send[at(q, e)];
      got += counts_recv[at(q, e)];
      b.recv_by_block[size_t(q) * L + e] = counts_recv[at(q, e)];
    }
    b.send_counts[q] = size_t(sent) * H;
    b.recv_counts[q] = size_t(got) * H;
    b.rows_sent += sent;
    b.rows_received += got;
    if (q != rank) {
      b.rows_sent_remote += sent;
      b.rows_received_remote += got;
    }
  }
  b.table = block_table(b.recv_by_block, P, L);
  return b;
}

std::vector<int64_t> etp_by_block(const std::vector<int64_t>& counts_recv_etp, int Q, int P, int N, int L, int ch) {
  if (counts_recv_etp.size() != size_t(Q) * P * N * L || ch < 0 || ch >= N)
    throw std::invalid_argument("etp_by_block: " + std::to_string(counts_recv_etp.size()) + " counts for " +
                                std::to_string(Q) + " ETP ranks x " + std::to_string(P) + " sources x " +
                                std::to_string(N) + " chunks x " + std::to_string(L) + " experts, chunk " +
                                std::to_string(ch));
  std::vector<int64_t> b(size_t(Q) * P * L, 0);
  for (int q = 0; q < Q; ++q)
    for (int s = 0; s < P; ++s)
      for (int e = 0; e < L; ++e)
        b[(size_t(q) * P + s) * L + e] = counts_recv_etp[((size_t(q) * P + s) * N + ch) * L + e];
  return b;
}

std::vector<int64_t> etp_rows(const std::vector<int64_t>& by_block, int Q, int P, int L) {
  std::vector<int64_t> r(size_t(Q), 0);
  for (int q = 0; q < Q; ++q)
    for (int i = 0; i < P * L; ++i) r[size_t(q)] += by_block[size_t(q) * P * L + i];
  return r;
}

}  // namespace lcplan::moe
