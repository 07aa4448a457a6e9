#include "estimator/hardware.h"

#include <algorithm>
#include <filesystem>

#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

namespace {

double positive(const nlohmann::json& j, const char* key, const std::string& name) {
  if (!j.contains(key) || !j.at(key).is_number() || !(j.at(key).get<double>() > 0))
    throw UserError("hardware \"" + name + "\": field \"" + key + "\" is missing or not a positive number");
  return j.at(key).get<double>();
}

}  // namespace

Hardware hardware_from_json(const nlohmann::json& j, const std::string& name) {
  if (!j.is_object()) throw UserError("hardware \"" + name + "\" must be a JSON object");
  Hardware h;
  h.name = j.contains("name") && j.at("name").is_string() ? j.at("name").get<std::string>() : name;
  h.hbm_bytes = positive(j, "hbm_bytes", name);
  h.hbm_bandwidth = positive(j, "hbm_bandwidth", name);
  h.peak_bf16_flops = positive(j, "peak_bf16_flops", name);
  h.peak_fp8_flops = positive(j, "peak_fp8_flops", name);
  if (j.contains("peak_fp4_flops")) h.peak_fp4_flops = positive(j, "peak_fp4_flops", name);
  if (j.contains("block_scaled")) {
    if (!j.at("block_scaled").is_boolean())
      throw UserError("hardware \"" + name + "\": field \"block_scaled\" must be true or false");
    h.block_scaled = j.at("block_scaled").get<bool>();
  }
  h.nvlink_bandwidth = positive(j, "nvlink_bandwidth", name);
  h.network_bandwidth = positive(j, "network_bandwidth", name);
  h.host_bandwidth = positive(j, "host_bandwidth", name);
  const double gpn = positive(j, "gpus_per_node", name);
  if (gpn != static_cast<int>(gpn) || gpn > 4096)
    throw UserError("hardware \"" + name + "\": field \"gpus_per_node\" must be a whole number up to 4096");
  h.gpus_per_node = static_cast<int>(gpn);
  if (j.contains("same_chip_as")) {
    if (!j.at("same_chip_as").is_string() || j.at("same_chip_as").get<std::string>().empty())
      throw UserError("hardware \"" + name + "\": field \"same_chip_as\" must be the name of a hardware profile");
    h.same_chip_as = j.at("same_chip_as").get<std::string>();
  }
  if (j.contains("source") && j.at("source").is_string()) h.source = j.at("source").get<std::string>();
  return h;
}

double gemm_peak_flops(const Hardware& hw, Precision p) {
  switch (p) {
    case Precision::BF16: return hw.peak_bf16_flops;
    case Precision::FP8:
    case Precision::MXFP8: return hw.peak_fp8_flops;
    case Precision::NVFP4: return hw.peak_fp4_flops > 0 ? hw.peak_fp4_flops : hw.peak_fp8_flops;
  }
  return hw.peak_bf16_flops;
}

std::string precision_support_error(const Hardware& hw, Precision p) {
  if ((p == Precision::MXFP8 || p == Precision::NVFP4) && !hw.block_scaled)
    return std::string("precision ") + to_string(p) + " needs block-scaled tensor cores, which " + hw.name +
           " does not have (use bf16 or fp8, or a Blackwell profile such as b200)";
  if (p == Precision::NVFP4 && hw.peak_fp4_flops <= 0)
    return "precision nvfp4 needs FP4 tensor cores; " + hw.name + " gives no peak_fp4_flops";
  return "";
}

std::vector<std::string> hardware_names(const std::string& data_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir + "/data/hardware", ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

Hardware load_hardware(const std::string& name_or_path, const std::string& data_dir) {
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  std::string path = is_path ? name_or_path : data_dir + "/data/hardware/" + name_or_path + ".json";
  if (!is_path && !std::filesystem::exists(path)) {
    std::string list;
    for (const auto& n : hardware_names(data_dir)) list += (list.empty() ? "" : ", ") + n;
    throw UserError("unknown hardware \"" + name_or_path + "\" (valid: " + list + ")");
  }
  return hardware_from_json(read_json_file(path, "hardware file"), name_or_path);
}

}  // namespace lcplan
