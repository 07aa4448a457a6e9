// Hardware: one GPU type and its node (data/hardware/<name>.json, datasheet values with their source).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/plan.h"

namespace lcplan {

struct Hardware {
  std::string name;
  double hbm_bytes = 0;            // usable device memory
  double hbm_bandwidth = 0;        // bytes/s
  double peak_bf16_flops = 0;      // dense, FLOP/s
  double peak_fp8_flops = 0;       // dense, FLOP/s (fp8 and mxfp8)
  double peak_fp4_flops = 0;       // dense, FLOP/s (nvfp4); 0 = no FP4 tensor cores
  bool block_scaled = false;       // tensor cores take MX/NV block-scaled formats (Blackwell): mxfp8, nvfp4
  double nvlink_bandwidth = 0;     // bytes/s per GPU per direction inside the NVLink domain
  double network_bandwidth = 0;    // bytes/s per GPU per direction across nodes
  double host_bandwidth = 0;       // bytes/s per GPU per direction to host memory (PCIe or C2C), for offload
  int gpus_per_node = 8;           // GPUs behind one NVLink domain (NVL72: 72)
  std::string same_chip_as;        // a profile with the same GPU die (H200, H800: H100's), whose fitted kernel
                                   // efficiencies a calibration without this one's applies (calibration_for)
  std::string source;
};

// Dense peak for GEMMs in a precision (FLOP/s): bf16, fp8 and mxfp8 at the fp8 rate, nvfp4 at the fp4 rate.
double gemm_peak_flops(const Hardware& hw, Precision p);
// One sentence when the hardware cannot run the precision (mxfp8/nvfp4 need block-scaled tensor cores), else empty.
std::string precision_support_error(const Hardware& hw, Precision p);

// Throws UserError naming the field.
Hardware hardware_from_json(const nlohmann::json& j, const std::string& name);
// A profile name under <data_dir>/data/hardware or a path to a JSON file.
Hardware load_hardware(const std::string& name_or_path, const std::string& data_dir);
std::vector<std::string> hardware_names(const std::string& data_dir);

}  // namespace lcplan
