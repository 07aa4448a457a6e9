// NCCL backend: bootstrapped over MPI, every call checked, stream-ordered (calls return once enqueued).
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "kernels/comm/backend.h"
#include "kernels/common/cuda_check.h"

namespace lcplan::comm::detail {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  throw std::invalid_argument("unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw std::invalid_argument("unknown reduce op");
}

ncclComm_t nc(const Comm& c) { return static_cast<ncclComm_t>(c.nccl); }
cudaStream_t st(const Comm& c) { return static_cast<cudaStream_t>(c.stream); }

const char* offset(const void* p, size_t elems, DType t) { return static_cast<const char*>(p) + elems * dtype_bytes(t); }
char* offset(void* p, size_t elems, DType t) { return static_cast<char*>(p) + elems * dtype_bytes(t); }

}  // namespace

bool nccl_compiled() { return true; }

void* nccl_init(MPI_Comm mpi, int rank, int size) {
  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  // The unique id is plain bytes: MPI carries it to the other ranks (no home-made rendezvous).
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi));
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return comm;
}

void nccl_destroy(void* nccl) { NCCL_CHECK(ncclCommDestroy(static_cast<ncclComm_t>(nccl))); }

void nccl_all_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op) {
  NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), nc(c), st(c)));
}

void nccl_all_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t) {
  NCCL_CHECK(ncclAllGather(send, recv, count_per_rank, nccl_type(t), nc(c), st(c)));
}

void nccl_reduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op) {
  NCCL_CHECK(ncclReduceScatter(send, recv, count_per_rank, nccl_type(t), nccl_op(op), nc(c), st(c)));
}

void nccl_broadcast(const Comm& c, void* buf, size_t count, DType t, int root) {
  NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(t), root, nc(c), st(c)));
}

void nccl_all_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                       void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t) {
  // Grouped point-to-point: one fused launch; empty pairs are skipped (NCCL would still sync on them).
  NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < c.size; ++r) {
    if (send_counts[r])
      NCCL_CHECK(ncclSend(offset(send, send_displs[r], t), send_counts[r], nccl_type(t), r, nc(c), st(c)));
    if (recv_counts[r])
      NCCL_CHECK(ncclRecv(offset(recv, recv_displs[r], t), recv_counts[r], nccl_type(t), r, nc(c), st(c)));
  }
  NCCL_CHECK(ncclGroupEnd());
}

void nccl_send(const Comm& c, const void* buf, size_t count, DType t, int peer) {
  NCCL_CHECK(ncclSend(buf, count, nccl_type(t), peer, nc(c), st(c)));
}

void nccl_recv(const Comm& c, void* buf, size_t count, DType t, int peer) {
  NCCL_CHECK(ncclRecv(buf, count, nccl_type(t), peer, nc(c), st(c)));
}

void nccl_sendrecv(const Comm& c, const void* send, void* recv, size_t count, DType t, int peer) {
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(send, count, nccl_type(t), peer, nc(c), st(c)));
  NCCL_CHECK(ncclRecv(recv, count, nccl_type(t), peer, nc(c), st(c)));
  NCCL_CHECK(ncclGroupEnd());
}

void nccl_record(const Comm& c, Request& r) {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(e, st(c)));
  r.event = e;
}

bool nccl_query(Request& r) {
  auto e = static_cast<cudaEvent_t>(r.event);
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaErrorNotReady) return false;
  CUDA_CHECK(q);
  CUDA_CHECK(cudaEventDestroy(e));
  r.event = nullptr;
  return true;
}

void nccl_sync(Request& r) {
  auto e = static_cast<cudaEvent_t>(r.event);
  CUDA_CHECK(cudaEventSynchronize(e));
  CUDA_CHECK(cudaEventDestroy(e));
  r.event = nullptr;
}

}  // namespace lcplan::comm::detail
