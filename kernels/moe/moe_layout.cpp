// chunk_layout (moe_layer.h): the per-chunk all-to-all bookkeeping of the GPU layers, pure host code.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/moe/moe_layer.h"
#include "kernels/moe/moe_math.h"

namespace lcplan::moe {

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
  b.expert_off.assign(size_t(L) + 1, 0);
  for (int e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int q = 0; q < P; ++q) n += b.recv_by_block[size_t(q) * L + e];
    b.expert_off[size_t(e) + 1] = b.expert_off[size_t(e)] + n;
  }
  for (int q = 0; q < P; ++q)
    for (int e = 0; e < L; ++e) {
      const int64_t n = b.recv_by_block[size_t(q) * L + e];
      if (!n) continue;
      b.blocks.push_back(block_offset_src_major(b.recv_by_block.data(), P, L, q, e));
      b.blocks.push_back(block_offset_expert_major(b.recv_by_block.data(), P, L, q, e));
      b.blocks.push_back(n);
      b.max_block_rows = std::max(b.max_block_rows, n);
    }
  return b;
}

}  // namespace lcplan::moe
