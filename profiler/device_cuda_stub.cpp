// Built when lcplan has no CUDA: the CUDA backend explains why it is absent.
#include "common/user_error.h"
#include "profiler/device.h"

namespace lcplan::profiler {

bool cuda_compiled() { return false; }

std::string cuda_unavailable_reason() {
  return "this lcplan was built without CUDA (configure with nvcc at /usr/local/cuda/bin/nvcc)";
}

int cuda_devices() { return 0; }

std::unique_ptr<Device> make_cuda_device(const comm::Comm&, const RepeatOptions&) {
  throw UserError("--backend cuda cannot run here: " + cuda_unavailable_reason() + " (use --backend cpu)");
}

}  // namespace lcplan::profiler
