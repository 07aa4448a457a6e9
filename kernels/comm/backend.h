// Internal: the NCCL half of the communicator. Implemented in comm_nccl.cpp when CUDA is on,
// and by comm_nccl_stub.cpp (every function throws) otherwise, so comm.cpp has no CUDA dependency.
#pragma once
#include "kernels/comm/comm.h"

namespace lcplan::comm::detail {

bool nccl_compiled();
// Largest element count of one point-to-point piece of the MPI all_to_all_v (default 2^30; both sides of a pair
// must cut the same way, so every rank sets the same value). Exists so tests can exercise the split with small counts.
void set_all_to_all_piece(size_t elems);
// NCCL communicator over `mpi` (collective over it): rank 0 of `mpi` makes the unique id and broadcasts it.
void* nccl_init(MPI_Comm mpi, int rank, int size);
void nccl_destroy(void* nccl);
void nccl_all_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op);
void nccl_all_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t);
void nccl_reduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op);
void nccl_broadcast(const Comm& c, void* buf, size_t count, DType t, int root);
void nccl_all_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                       void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t);
void nccl_send(const Comm& c, const void* buf, size_t count, DType t, int peer);
void nccl_recv(const Comm& c, void* buf, size_t count, DType t, int peer);
void nccl_sendrecv(const Comm& c, const void* send, void* recv, size_t count, DType t, int peer);
// Record an event on the comm stream into r.event; query/synchronize/destroy it.
void nccl_record(const Comm& c, Request& r);
bool nccl_query(Request& r);
void nccl_sync(Request& r);

}  // namespace lcplan::comm::detail
