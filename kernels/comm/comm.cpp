// MPI backend of the communicator and the backend dispatch. NCCL calls go to backend.h (stubbed without CUDA).
#include "kernels/comm/comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>
#include <stdexcept>
#include <string>

#include "kernels/comm/backend.h"
#include "kernels/common/bf16.h"

namespace lcplan::comm {

static_assert(sizeof(size_t) == sizeof(uint64_t), "counts are exchanged as uint64");

void mpi_check(int rc, const char* what, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;  // no message to add; the code is still reported
  throw std::runtime_error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           (len ? std::string(msg, len) : "MPI error " + std::to_string(rc)));
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: return MPI_UINT16_T;  // bits only; reductions use the user ops below
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  throw std::invalid_argument("unknown dtype");
}

int to_int(size_t v, const char* what) {
  if (v > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument(std::string(what) + " = " + std::to_string(v) +
                                " elements exceeds MPI's int count limit (2^31-1); split the call");
  return static_cast<int>(v);
}

// bf16 reductions: upcast each pair to fp32, combine, round back (one rounding per combine, like NCCL).
template <class F>
void bf16_apply(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(f(bf16_to_f32(a[i]), bf16_to_f32(b[i])));
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return x + y; });
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return std::max(x, y); });
}
void bf16_min(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return std::min(x, y); });
}

// The MPI op for (dtype, op); bf16 gets a freshly created user op that the caller frees (no global state).
MPI_Op make_op(DType t, ReduceOp op, bool* user) {
  *user = false;
  if (t == DType::BF16) {
    MPI_Op o;
    MPI_User_function* fn = op == ReduceOp::Sum ? bf16_sum : op == ReduceOp::Max ? bf16_max : bf16_min;
    MPI_CHECK(MPI_Op_create(fn, 1, &o));
    *user = true;
    return o;
  }
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  throw std::invalid_argument("unknown reduce op");
}

// Largest piece of one all-to-all pair: below INT_MAX, and both sides cut a count into the same pieces.
size_t g_piece = size_t(1) << 30;

void check_tag(int tag) {
  if (tag < 0 || tag >= kAllToAllTag)
    throw std::invalid_argument("tag " + std::to_string(tag) + " is outside 0.." + std::to_string(kAllToAllTag - 1) +
                                " (" + std::to_string(kAllToAllTag) + " is reserved for all_to_all_v)");
}

bool is_nccl(const Comm& c) { return c.backend == Backend::Nccl; }

void set_errors_return(MPI_Comm c) { MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN)); }

std::string list_str(const int* a, int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(a[i]);
  }
  return s + "}";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Completes n requests: MPI_Waitall, or under a watchdog a polling loop that also looks for failure notices and the
// deadline. It yields between polls (oversubscribed ranks leave their peers the core) but never sleeps: a large
// shared-memory message moves one fragment per receiver progress call, so a sleeping receiver stalls its sender.
void complete(const Watchdog* w, MPI_Request* reqs, int n, const char* what) {
  if (!w) {
    MPI_CHECK(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (long spin = 0;; ++spin) {
    int done = 0;
    MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    if (spin % 64 == 0) check_watchdog(*w, seconds_since(t0), what);  // a probe and a clock read, not every poll
    std::this_thread::yield();
  }
}

}  // namespace

void check_watchdog(const Watchdog& w, double waited, const char* what) {
  if (w.notices != MPI_COMM_NULL) {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, w.notices, &flag, &st));
    if (flag) {
      int len = 0;
      MPI_CHECK(MPI_Get_count(&st, MPI_CHAR, &len));
      std::string msg(static_cast<size_t>(std::max(len, 0)), ' ');
      MPI_CHECK(MPI_Recv(msg.data(), len, MPI_CHAR, st.MPI_SOURCE, kNoticeTag, w.notices, MPI_STATUS_IGNORE));
      const std::string m = "rank " + std::to_string(st.MPI_SOURCE) + " failed: " + msg;
      if (w.on_failure) w.on_failure(st.MPI_SOURCE, m);
      throw PeerFailure(st.MPI_SOURCE, m);
    }
  }
  if (w.timeout_seconds > 0 && waited > w.timeout_seconds) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", w.timeout_seconds);
    const std::string m = std::string(what) + " waited longer than the " + buf +
                          " s timeout for its peers (a rank failed, died or hangs)";
    if (w.on_failure) w.on_failure(-1, m);
    throw PeerFailure(-1, m);
  }
}

std::vector<MPI_Request> send_failure_notice(const Watchdog& w, const std::string& message) {
  std::vector<MPI_Request> reqs;
  if (w.notices == MPI_COMM_NULL) return reqs;
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(w.notices, &rank));
  MPI_CHECK(MPI_Comm_size(w.notices, &size));
  const int len = static_cast<int>(std::min<size_t>(message.size(), 4096));  // one sentence; never unbounded
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    reqs.emplace_back();
    MPI_CHECK(MPI_Isend(message.data(), len, MPI_CHAR, r, kNoticeTag, w.notices, &reqs.back()));
  }
  return reqs;
}

bool finish_after_failure(const Watchdog& w, std::vector<MPI_Request>& sent, double seconds) {
  if (w.notices == MPI_COMM_NULL) return true;
  const auto t0 = std::chrono::steady_clock::now();
  MPI_Request bar;
  MPI_CHECK(MPI_Ibarrier(w.notices, &bar));
  for (;;) {
    int a = 0, b = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(sent.size()), sent.data(), &a, MPI_STATUSES_IGNORE));
    MPI_CHECK(MPI_Test(&bar, &b, MPI_STATUS_IGNORE));
    if (a && b) return true;
    // Notices from other failing ranks still arrive here; drain them so their senders complete too.
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, w.notices, &flag, &st));
    if (flag) {
      int len = 0;
      MPI_CHECK(MPI_Get_count(&st, MPI_CHAR, &len));
      std::string msg(static_cast<size_t>(std::max(len, 0)), ' ');
      MPI_CHECK(MPI_Recv(msg.data(), len, MPI_CHAR, st.MPI_SOURCE, kNoticeTag, w.notices, MPI_STATUS_IGNORE));
    }
    if (seconds_since(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  throw std::invalid_argument("unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

bool nccl_compiled() { return detail::nccl_compiled(); }

void detail::set_all_to_all_piece(size_t elems) {
  if (elems < 1 || elems > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument("all_to_all_v piece of " + std::to_string(elems) + " elements is outside 1..2^31-1");
  g_piece = elems;
}

Comm world_mpi() {
  int init = 0;
  MPI_CHECK(MPI_Initialized(&init));
  if (!init) throw std::runtime_error("world_mpi: MPI is not initialised; call MPI_Init first (start with mpirun)");
  Comm c;
  // A duplicate keeps our traffic apart from the caller's and lets errors return instead of aborting.
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c.mpi));
  set_errors_return(c.mpi);
  MPI_CHECK(MPI_Comm_rank(c.mpi, &c.rank));
  MPI_CHECK(MPI_Comm_size(c.mpi, &c.size));
  return c;
}

Comm world_nccl(void* stream) {
  Comm c = world_mpi();
  c.backend = Backend::Nccl;
  c.stream = stream;
  c.nccl = detail::nccl_init(c.mpi, c.rank, c.size);
  return c;
}

Comm split(const Comm& parent, const std::vector<int>& ranks) {
  // Gather every rank's list so all ranks run the same checks on the same data and agree on the verdict.
  const int n = static_cast<int>(ranks.size());
  std::vector<int> lens(parent.size);
  MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, parent.mpi));
  std::vector<int> displs(parent.size + 1, 0);
  for (int r = 0; r < parent.size; ++r) displs[r + 1] = displs[r] + lens[r];
  std::vector<int> all(std::max(1, displs[parent.size]));
  MPI_CHECK(MPI_Allgatherv(ranks.data(), n, MPI_INT, all.data(), lens.data(), displs.data(), MPI_INT, parent.mpi));

  auto list = [&](int r) { return all.data() + displs[r]; };
  std::string err;
  for (int r = 0; r < parent.size && err.empty(); ++r) {
    const int* a = list(r);
    if (lens[r] == 0) {
      err = "split: rank " + std::to_string(r) + " passed an empty group";
      break;
    }
    if (std::find(a, a + lens[r], r) == a + lens[r]) {
      err = "split: rank " + std::to_string(r) + " is not in its own group " + list_str(a, lens[r]);
      break;
    }
    for (int i = 0; i < lens[r] && err.empty(); ++i) {
      const int m = a[i];
      if (m < 0 || m >= parent.size) {
        err = "split: rank " + std::to_string(r) + " names rank " + std::to_string(m) + " outside the parent of " +
              std::to_string(parent.size);
      } else if (std::count(a, a + lens[r], m) > 1) {
        err = "split: rank " + std::to_string(r) + " names rank " + std::to_string(m) + " twice";
      } else if (lens[m] != lens[r] || !std::equal(a, a + lens[r], list(m))) {
        err = "split: mismatched groups: rank " + std::to_string(r) + " passed " + list_str(a, lens[r]) +
              " (size " + std::to_string(lens[r]) + ") but rank " + std::to_string(m) + " passed " +
              list_str(list(m), lens[m]) + " (size " + std::to_string(lens[m]) + ")";
      }
    }
  }
  if (!err.empty()) throw std::invalid_argument(err);

  const int color = *std::min_element(ranks.begin(), ranks.end());
  const int key = static_cast<int>(std::find(ranks.begin(), ranks.end(), parent.rank) - ranks.begin());
  Comm c;
  c.backend = parent.backend;
  c.stream = parent.stream;
  c.watchdog = parent.watchdog;
  MPI_CHECK(MPI_Comm_split(parent.mpi, color, key, &c.mpi));
  set_errors_return(c.mpi);
  MPI_CHECK(MPI_Comm_rank(c.mpi, &c.rank));
  MPI_CHECK(MPI_Comm_size(c.mpi, &c.size));
  if (is_nccl(c)) c.nccl = detail::nccl_init(c.mpi, c.rank, c.size);
  return c;
}

void free_comm(Comm& c) {
  if (c.nccl) detail::nccl_destroy(c.nccl);
  c.nccl = nullptr;
  MPI_Comm m = c.mpi;
  c.mpi = MPI_COMM_NULL;  // cleared first: a failed free must not be retried on a dangling handle
  if (m != MPI_COMM_NULL && m != MPI_COMM_WORLD && m != MPI_COMM_SELF) MPI_CHECK(MPI_Comm_free(&m));
}

void require_same(const Comm& c, long long value, const std::string& what) {
  long long mm[2] = {value, -value};  // one MIN reduction yields min and -max
  MPI_Request rq;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, mm, 2, MPI_LONG_LONG, MPI_MIN, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "require_same");
  if (mm[0] != -mm[1])
    throw std::invalid_argument("ranks disagree on " + what + ": values range from " + std::to_string(mm[0]) +
                                " to " + std::to_string(-mm[1]) + "; every rank must pass the same value");
}

void raise_if_any(const Comm& c, const std::string& error) {
  int first = error.empty() ? c.size : c.rank;
  MPI_Request rq;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "raise_if_any");
  if (first == c.size) return;
  int len = c.rank == first ? static_cast<int>(error.size()) : 0;
  MPI_CHECK(MPI_Ibcast(&len, 1, MPI_INT, first, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "raise_if_any");
  std::string msg(static_cast<size_t>(len), ' ');
  if (c.rank == first) msg = error;
  MPI_CHECK(MPI_Ibcast(msg.data(), len, MPI_CHAR, first, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "raise_if_any");
  throw std::invalid_argument(msg);
}

void all_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op) {
  if (is_nccl(c)) return detail::nccl_all_reduce(c, buf, count, t, op);
  Request r = iall_reduce(c, buf, count, t, op);
  wait(r);
}

void all_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t) {
  if (is_nccl(c)) return detail::nccl_all_gather(c, send, recv, count_per_rank, t);
  Request r = iall_gather(c, send, recv, count_per_rank, t);
  wait(r);
}

void reduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op) {
  if (is_nccl(c)) return detail::nccl_reduce_scatter(c, send, recv, count_per_rank, t, op);  // in place too
  const size_t bytes = count_per_rank * dtype_bytes(t);
  if (recv == static_cast<const char*>(send) + size_t(c.rank) * bytes && bytes > 0) {
    // In place as NCCL defines it (recv is this rank's block of send): MPI's MPI_IN_PLACE leaves the block at the
    // start of the buffer instead, so it is moved to the rank's offset (host memory: the MPI backend's).
    bool user = false;
    MPI_Op o = make_op(t, op, &user);
    MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, const_cast<void*>(send),
                                       to_int(count_per_rank, "reduce_scatter count"), mpi_type(t), o, c.mpi));
    if (user) MPI_CHECK(MPI_Op_free(&o));
    if (c.rank != 0) std::memmove(recv, send, bytes);
    return;
  }
  Request r = ireduce_scatter(c, send, recv, count_per_rank, t, op);
  wait(r);
}

void broadcast(const Comm& c, void* buf, size_t count, DType t, int root) {
  if (root < 0 || root >= c.size)
    throw std::invalid_argument("broadcast root " + std::to_string(root) + " is outside the group of " +
                                std::to_string(c.size));
  if (is_nccl(c)) return detail::nccl_broadcast(c, buf, count, t, root);
  MPI_Request rq;
  MPI_CHECK(MPI_Ibcast(buf, to_int(count, "broadcast count"), mpi_type(t), root, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "broadcast");
}

void all_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                  const size_t* recv_counts, const size_t* recv_displs, DType t) {
  if (is_nccl(c))
    return detail::nccl_all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  Request r = iall_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  wait(r);
}

void send(const Comm& c, const void* buf, size_t count, DType t, int peer, int tag) {
  check_tag(tag);
  if (is_nccl(c)) return detail::nccl_send(c, buf, count, t, peer);
  if (!c.watchdog) {
    MPI_CHECK(MPI_Send(buf, to_int(count, "send count"), mpi_type(t), peer, tag, c.mpi));
    return;
  }
  Request r = isend(c, buf, count, t, peer, tag);
  wait(r);
}

void recv(const Comm& c, void* buf, size_t count, DType t, int peer, int tag) {
  check_tag(tag);
  if (is_nccl(c)) return detail::nccl_recv(c, buf, count, t, peer);
  if (!c.watchdog) {
    MPI_CHECK(MPI_Recv(buf, to_int(count, "recv count"), mpi_type(t), peer, tag, c.mpi, MPI_STATUS_IGNORE));
    return;
  }
  Request r = irecv(c, buf, count, t, peer, tag);
  wait(r);
}

void sendrecv(const Comm& c, const void* send, void* recv, size_t count, DType t, int peer, int tag) {
  check_tag(tag);
  if (peer < 0 || peer >= c.size)
    throw std::invalid_argument("sendrecv: peer " + std::to_string(peer) + " is outside 0.." + std::to_string(c.size - 1));
  if (is_nccl(c)) return detail::nccl_sendrecv(c, send, recv, count, t, peer);
  MPI_Request rq[2];
  MPI_CHECK(MPI_Irecv(recv, to_int(count, "sendrecv count"), mpi_type(t), peer, tag, c.mpi, &rq[0]));
  MPI_CHECK(MPI_Isend(send, to_int(count, "sendrecv count"), mpi_type(t), peer, tag, c.mpi, &rq[1]));
  complete(c.watchdog, rq, 2, "sendrecv");
}

void exchange_counts(const Comm& c, const size_t* send, size_t* recv, size_t per_rank) {
  MPI_Request rq;
  MPI_CHECK(MPI_Ialltoall(send, to_int(per_rank, "exchange_counts"), MPI_UINT64_T, recv,
                          to_int(per_rank, "exchange_counts"), MPI_UINT64_T, c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "exchange_counts");
}

void barrier(const Comm& c) {
  MPI_Request rq;
  MPI_CHECK(MPI_Ibarrier(c.mpi, &rq));
  complete(c.watchdog, &rq, 1, "barrier");
}

// ---- non-blocking ----

Request iall_reduce(const Comm& c, void* buf, size_t count, DType t, ReduceOp op) {
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_all_reduce(c, buf, count, t, op);
    detail::nccl_record(c, r);
    return r;
  }
  bool user = false;
  MPI_Op o = make_op(t, op, &user);
  if (user) r.op = o;
  r.mpi.resize(1);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce count"), mpi_type(t), o, c.mpi, &r.mpi[0]));
  return r;
}

Request iall_gather(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t) {
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_all_gather(c, send, recv, count_per_rank, t);
    detail::nccl_record(c, r);
    return r;
  }
  const int n = to_int(count_per_rank, "all_gather count");
  r.mpi.resize(1);
  MPI_CHECK(MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), c.mpi, &r.mpi[0]));
  return r;
}

Request ireduce_scatter(const Comm& c, const void* send, void* recv, size_t count_per_rank, DType t, ReduceOp op) {
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_reduce_scatter(c, send, recv, count_per_rank, t, op);
    detail::nccl_record(c, r);
    return r;
  }
  bool user = false;
  MPI_Op o = make_op(t, op, &user);
  if (user) r.op = o;
  r.mpi.resize(1);
  MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, to_int(count_per_rank, "reduce_scatter count"), mpi_type(t), o,
                                      c.mpi, &r.mpi[0]));
  return r;
}

Request iall_to_all_v(const Comm& c, const void* send, const size_t* send_counts, const size_t* send_displs,
                      void* recv, const size_t* recv_counts, const size_t* recv_displs, DType t) {
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    detail::nccl_record(c, r);
    return r;
  }
  const size_t esz = dtype_bytes(t);
  const MPI_Datatype type = mpi_type(t);
  const char* sbuf = static_cast<const char*>(send);
  char* rbuf = static_cast<char*>(recv);
  // Pieces of a pair go out in order and MPI never reorders messages of one (source, tag), so they match.
  auto post = [&](bool is_recv, int peer, size_t count, size_t displ) {
    for (size_t done = 0; done < count; done += g_piece) {
      const int n = static_cast<int>(std::min(g_piece, count - done));
      r.mpi.emplace_back();
      const size_t off = (displ + done) * esz;
      if (is_recv) MPI_CHECK(MPI_Irecv(rbuf + off, n, type, peer, kAllToAllTag, c.mpi, &r.mpi.back()));
      else MPI_CHECK(MPI_Isend(sbuf + off, n, type, peer, kAllToAllTag, c.mpi, &r.mpi.back()));
    }
  };
  // Receives first so arriving data has a place to land; peers in rotated order so rank 0 is not everyone's first.
  for (int i = 0; i < c.size; ++i) {
    const int peer = (c.rank + c.size - i) % c.size;
    post(true, peer, recv_counts[peer], recv_displs[peer]);
  }
  for (int i = 0; i < c.size; ++i) {
    const int peer = (c.rank + i) % c.size;
    post(false, peer, send_counts[peer], send_displs[peer]);
  }
  return r;
}

Request isend(const Comm& c, const void* buf, size_t count, DType t, int peer, int tag) {
  check_tag(tag);
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_send(c, buf, count, t, peer);
    detail::nccl_record(c, r);
    return r;
  }
  r.mpi.resize(1);
  MPI_CHECK(MPI_Isend(buf, to_int(count, "send count"), mpi_type(t), peer, tag, c.mpi, &r.mpi[0]));
  return r;
}

Request irecv(const Comm& c, void* buf, size_t count, DType t, int peer, int tag) {
  check_tag(tag);
  Request r;
  r.active = true;
  r.watchdog = c.watchdog;
  if (is_nccl(c)) {
    r.backend = Backend::Nccl;
    detail::nccl_recv(c, buf, count, t, peer);
    detail::nccl_record(c, r);
    return r;
  }
  r.mpi.resize(1);
  MPI_CHECK(MPI_Irecv(buf, to_int(count, "recv count"), mpi_type(t), peer, tag, c.mpi, &r.mpi[0]));
  return r;
}

namespace {
void finish(Request& r) {
  r.mpi.clear();
  r.active = false;
  if (r.op != MPI_OP_NULL) MPI_CHECK(MPI_Op_free(&r.op));
}
}  // namespace

void wait(Request& r) {
  if (!r.active) return;
  if (r.backend == Backend::Nccl) {
    detail::nccl_sync(r);
    r.active = false;
    return;
  }
  complete(r.watchdog, r.mpi.data(), static_cast<int>(r.mpi.size()), "a collective");
  finish(r);
}

bool test(Request& r) {
  if (!r.active) return true;
  if (r.backend == Backend::Nccl) {
    if (!detail::nccl_query(r)) return false;
    r.active = false;
    return true;
  }
  int done = 0;
  MPI_CHECK(MPI_Testall(static_cast<int>(r.mpi.size()), r.mpi.data(), &done, MPI_STATUSES_IGNORE));
  if (done) finish(r);
  return done != 0;
}

}  // namespace lcplan::comm
