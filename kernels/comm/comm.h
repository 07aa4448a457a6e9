// Communicator: one interface, two real backends (MPI on CPUs, NCCL on GPUs).
// A Comm is a plain struct (backend tag + handles); collectives are free functions that dispatch on the tag.
// Processes are started by mpirun/srun; NCCL is bootstrapped by broadcasting its unique id over MPI.
//
// Buffers live where the backend computes: host memory for Mpi, device memory for Nccl. Count arrays
// (all_to_all_v) are always host arrays. Every function must be called by every member of the Comm.
// Errors throw std::runtime_error (backend failure) or std::invalid_argument (bad arguments); argument
// checks that need other ranks' values are done collectively first so every rank throws, none hangs.
//
// Counts: all_reduce, all_gather, reduce_scatter and broadcast take one count that must be the same on every
// rank (any value, odd included); only all_to_all_v takes uneven per-peer counts (zero allowed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpi.h>

namespace lcplan::comm {

enum class Backend : uint8_t { Mpi, Nccl };
enum class DType : uint8_t { F32, F64, BF16, I32, I64 };
enum class ReduceOp : uint8_t { Sum, Max, Min };

size_t dtype_bytes(DType t);
const char* dtype_name(DType t);

// Bounded waiting (lcplan-exec): while a Comm with a watchdog waits on MPI, it polls the request and between polls
// looks for a failure notice from any rank on `notices` (tag kNoticeTag, sent by send_failure_notice) and checks the
// deadline; either ends the wait with PeerFailure, so a rank whose peer failed or hangs reports it instead of hanging.
// Without a watchdog every wait blocks in MPI as before. The watchdog must outlive every Comm that points to it.
constexpr int kNoticeTag = 32766;  // reserved for failure notices on the notices communicator
struct Watchdog {
  MPI_Comm notices = MPI_COMM_NULL;  // a communicator over every rank of the job, used only for notices
  double timeout_seconds = 0;        // > 0: a single wait longer than this throws PeerFailure
  // Called with (origin, message) instead of throwing when set, and must not return: a rank whose wait is cut short
  // still has requests in flight into buffers that unwinding the stack would free (lcplan-exec reports, meets the
  // other ranks with finish_after_failure and exits in place).
  std::function<void(int origin, const std::string& message)> on_failure;
};

// A wait ended because another rank reported a failure (origin >= 0: its rank in `notices`) or the deadline passed
// (origin = -1). what() is one sentence.
struct PeerFailure : std::runtime_error {
  int origin = -1;
  PeerFailure(int from, const std::string& msg) : std::runtime_error(msg), origin(from) {}
};

struct Comm {
  Backend backend = Backend::Mpi;
  int rank = 0;
  int size = 1;
  MPI_Comm mpi = MPI_COMM_NULL;   // always valid: also used to bootstrap NCCL and to exchange counts
  void* nccl = nullptr;           // ncclComm_t when backend == Nccl
  void* stream = nullptr;         // cudaStream_t for NCCL calls (nullptr = default stream)
  const Watchdog* watchdog = nullptr;  // bounded waits (see Watchdog); split() passes it on to sub-groups
};

// Throws std::runtime_error naming the call, file and line unless rc is MPI_SUCCESS (MPI_CHECK below).
void mpi_check(int rc, const char* what, const char* file, int line);
#define MPI_CHECK(call) ::lcplan::comm::mpi_check((call), #call, __FILE__, __LINE__)

// An outstanding non-blocking operation. MPI: its request handles; NCCL: a cudaEvent_t recorded on the comm
// stream after the call. Move-only: a copy would hold the same MPI handles, and completing both is an error.
// Complete it (wait, or test until true) before it is destroyed.
struct Request {
  Backend backend = Backend::Mpi;
  std::vector<MPI_Request> mpi;
  MPI_Op op = MPI_OP_NULL;        // user op for bf16 reductions, freed on completion
  void* event = nullptr;          // cudaEvent_t (Nccl)
  bool active = false;
  const Watchdog* watchdog = nullptr;  // copied from the Comm that issued it

  Request() = default;
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
};

// A duplicate of MPI_COMM_WORLD (MPI must already be initialised; collective). Errors return instead of abort.
Comm world_mpi();
// NCCL communicator over MPI_COMM_WORLD: rank 0 creates the unique id and broadcasts it over MPI.
// The caller has selected its device (cudaSetDevice). Throws when lcplan was built without CUDA.
Comm world_nccl(void* stream = nullptr);
// True when this build carries the NCCL backend.
bool nccl_compiled();

// Sub-group of `parent` made of `ranks` (ranks of the parent, in order); every member of parent must call it
// with the list of the group it belongs to. The lists are checked collectively (every rank in its own list,
// lists of the same group identical, groups disjoint) and a mismatch throws std::invalid_argument on every rank.
// Same backend as the parent (a NCCL parent gets a NCCL sub-communicator).
Comm split(const Comm& parent, const std::vector<int>& ranks);
void free_comm(Comm& c);

// Throws std::invalid_argument on every rank unless all ranks of `c` pass the same `value` (one small
// all-reduce on the host). `what` names the value in the message. Use it before communicating.
void require_same(const Comm& c, long long value, const std::string& what);
// Collective error check: if any rank has a non-empty `error`, every rank throws std::invalid_argument with
// the message of the lowest failing rank. Use it to turn a local argument check into one every rank sees.
void raise_if_any(const Comm& c, const std::string& error);

// Blocking collectives. Counts are in elements of `t`.
void all_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op);
void all_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t);
// reduce_scatter may run in place, as NCCL defines it: recv == send + rank * count_per_rank elements, on every rank.
void reduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op);
void broadcast(const Comm& c, void* buf, size_t count, DType t, int root);
// send_counts[r] elements go to rank r from offset send_displs[r]; likewise for receive. Counts must agree
// pairwise (send_counts[r] on rank q == recv_counts[q] on rank r; exchange_counts gives that). Over MPI it runs as
// point-to-point pieces of at most 2^30 elements with tag kAllToAllTag, so no count or displacement is too large
// to express and no rank can reject its arguments alone while its peers wait.
constexpr int kAllToAllTag = 32767;  // the largest tag every MPI must support; reserved, send/recv refuse it
void all_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                  void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t);
// Tags 0 .. kAllToAllTag-1.
void send(const Comm& c, const void* buf, size_t count, DType t, int peer, int tag = 0);
void recv(const Comm& c, void* buf, size_t count, DType t, int peer, int tag = 0);
// Sends `count` elements of `send` to `peer` and receives as many from it into `recv`; the peer makes the same call
// naming this rank. NCCL: one group, so neither side's send waits on the other's receive on its stream.
void sendrecv(const Comm& c, const void* send, void* recv, size_t count, DType t, int peer, int tag = 0);
// Host-side equal all-to-all of counts (always over c.mpi): send[r*per_rank..] goes to rank r.
// This is the "exchange counts first" step of every variable all-to-all.
void exchange_counts(const Comm& c, const size_t* send, size_t* recv, size_t per_rank);
void barrier(const Comm& c);

// Non-blocking variants: the buffers (and count arrays) must stay valid until wait/test reports completion.
Request iall_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op);
Request iall_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t);
Request ireduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op);
Request iall_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                      void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t);
Request isend(const Comm& c, const void* buf, size_t count, DType t, int peer, int tag = 0);
Request irecv(const Comm& c, void* buf, size_t count, DType t, int peer, int tag = 0);
// Blocks until done (NCCL: the host waits for the recorded event). Safe on an inactive request. With a watchdog it
// polls and may throw PeerFailure (the request is then left incomplete: the job is failing and must not finalize
// cleanly).
void wait(Request& r);
// Drives progress and returns true once done (MPI progresses only inside MPI calls, so poll this while computing).
bool test(Request& r);

// Sends `message` to every other rank of w.notices (non-blocking; the returned requests complete once delivered,
// which finish_after_failure waits for). Call it from the rank where the failure happened.
std::vector<MPI_Request> send_failure_notice(const Watchdog& w, const std::string& message);
// Throws PeerFailure if a failure notice has arrived on w.notices (never blocks). `waited` and `what` shape the
// deadline message: a wait that has lasted `waited` seconds beyond w.timeout_seconds throws too.
void check_watchdog(const Watchdog& w, double waited, const char* what);
// After a failure was reported on this rank: completes `sent` and meets every other rank in a barrier on w.notices,
// both bounded by `seconds`, so no rank leaves (and no launcher kills the job) before every rank had its say.
// Returns false when the bound passed first (a rank died or hangs).
bool finish_after_failure(const Watchdog& w, std::vector<MPI_Request>& sent, double seconds);

}  // namespace lcplan::comm
