// Communicator: one interface, two real backends (MPI on CPUs, NCCL on GPUs).
// A Comm is a plain struct (backend tag + handles); collectives are free functions that dispatch on the tag.
// Processes are started by mpirun/srun; NCCL is bootstrapped by broadcasting its unique id over MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <mpi.h>

namespace lcplan::comm {

enum class Backend : uint8_t { Mpi, Nccl };
enum class DType : uint8_t { F32, F64, BF16, I32, I64 };
enum class ReduceOp : uint8_t { Sum, Max, Min };

size_t dtype_bytes(DType t);

struct Comm {
  Backend backend = Backend::Mpi;
  int rank = 0;
  int size = 1;
  MPI_Comm mpi = MPI_COMM_NULL;   // always valid: also used to bootstrap NCCL and to exchange counts
  void* nccl = nullptr;           // ncclComm_t when backend == Nccl
  void* stream = nullptr;         // cudaStream_t for NCCL calls (nullptr = default stream)
};

// Wraps MPI_COMM_WORLD (MPI must already be initialised).
Comm world_mpi();
// Sub-group of `parent` made of `ranks` (ranks of the parent, in order); every member of parent must call it
// with the list of the group it belongs to. Throws std::invalid_argument if this rank is not in `ranks`.
Comm split(const Comm& parent, const std::vector<int>& ranks);
void free_comm(Comm& c);

// Blocking collectives. Counts are in elements of `t`.
void all_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op);
void all_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t);
void reduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op);
// send_counts[r] elements go to rank r from offset send_displs[r]; likewise for receive.
void all_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                  void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t);
void send(const Comm& c, const void* buf, size_t count, DType t, int peer, int tag = 0);
void recv(const Comm& c, void* buf, size_t count, DType t, int peer, int tag = 0);

}  // namespace lcplan::comm
