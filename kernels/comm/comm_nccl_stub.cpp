// Built without CUDA: the NCCL backend exists in the interface but every entry point says why it cannot run.
#include <stdexcept>

#include "kernels/comm/backend.h"

namespace lcplan::comm::detail {

namespace {
[[noreturn]] void no_nccl() {
  throw std::runtime_error("the NCCL backend is not available: lcplan was built without CUDA (LCPLAN_CUDA=OFF or no nvcc)");
}
}  // namespace

bool nccl_compiled() { return false; }
void* nccl_init(MPI_Comm, int, int) { no_nccl(); }
void nccl_destroy(void*) { no_nccl(); }
void nccl_all_reduce(const Comm&, void*, size_t, DType, ReduceOp) { no_nccl(); }
void nccl_all_gather(const Comm&, const void*, void*, size_t, DType) { no_nccl(); }
void nccl_reduce_scatter(const Comm&, const void*, void*, size_t, DType, ReduceOp) { no_nccl(); }
void nccl_broadcast(const Comm&, void*, size_t, DType, int) { no_nccl(); }
void nccl_all_to_all_v(const Comm&, const void*, const size_t*, const size_t*, void*, const size_t*, const size_t*,
                       DType) {
  no_nccl();
}
void nccl_send(const Comm&, const void*, size_t, DType, int) { no_nccl(); }
void nccl_recv(const Comm&, void*, size_t, DType, int) { no_nccl(); }
void nccl_sendrecv(const Comm&, const void*, void*, size_t, DType, int) { no_nccl(); }
void nccl_record(const Comm&, Request&) { no_nccl(); }
bool nccl_query(Request&) { no_nccl(); }
void nccl_sync(Request&) { no_nccl(); }

}  // namespace lcplan::comm::detail
