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
  h.nvlink_bandwidth = positive(j, "nvlink_bandwidth", name);
  h.network_bandwidth = positive(j, "network_bandwidth", name);
  h.host_bandwidth = positive(j, "host_bandwidth", name);
  const double gpn = positive(j, "gpus_per_node", name);
  if (gpn != static_cast<int>(gpn) || gpn > 4096)
    throw UserError("hardware \"" + name + "\": field \"gpus_per_node\" must be a whole number up to 4096");
  h.gpus_per_node = static_cast<int>(gpn);
  if (j.contains("source") && j.at("source").is_string()) h.source = j.at("source").get<std::string>();
  return h;
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
