#include "profiler/machine.h"

#include <mpi.h>

#include <cctype>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include <Eigen/Core>

namespace lcplan::profiler {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The value of the first "key : value" line of a /proc file whose key is one of `keys` (in order of preference).
std::string proc_field(const char* path, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && trim(line.substr(0, colon)) == key) return trim(line.substr(colon + 1));
    }
  }
  return "";
}

}  // namespace

CpuMachine cpu_machine() {
  CpuMachine m;
  m.model = proc_field("/proc/cpuinfo", {"model name", "Hardware", "cpu model", "Processor"});
  if (m.model.empty()) m.model = "unknown CPU";
  m.logical_cpus = std::max(1u, std::thread::hardware_concurrency());
  const std::string mem = proc_field("/proc/meminfo", {"MemTotal"});  // "24568392 kB"
  std::istringstream in(mem);
  double kb = 0;
  if (in >> kb) m.memory_bytes = kb * 1024;
  return m;
}

std::string cpu_profile_name(const CpuMachine& m) {
  std::string slug;
  for (char c : m.model) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) slug += char(std::tolower(u));
    else if (!slug.empty() && slug.back() != '-') slug += '-';
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  if (slug.size() > 40) slug.resize(40);
  if (slug.empty()) slug = "unknown";
  return "cpu-" + slug + "-" + std::to_string(m.logical_cpus) + "c";
}

std::string utc_date() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string cpu_library_versions() {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string lib(mpi, size_t(std::max(0, len)));
  lib = lib.substr(0, lib.find_first_of(",\n"));
  std::string out = "compiler " + std::string(__VERSION__) + ", Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
                    std::to_string(EIGEN_MAJOR_VERSION) + "." + std::to_string(EIGEN_MINOR_VERSION) + ", " + trim(lib);
  return out;
}

}  // namespace lcplan::profiler
