// What machine a profile was measured on, for the provenance of every measured coefficient: the CPU model and
// memory from /proc (Linux), the date from the system clock, library versions compiled in. GPU facts come from
// the CUDA device (device_cuda.cpp).
#pragma once

#include <string>

namespace lcplan::profiler {

struct CpuMachine {
  std::string model;        // /proc/cpuinfo "model name" (or "Hardware", "cpu model"), "unknown CPU" otherwise
  int logical_cpus = 1;     // std::thread::hardware_concurrency
  double memory_bytes = 0;  // /proc/meminfo MemTotal
};
CpuMachine cpu_machine();

// A stable hardware-profile name for this CPU: "cpu-" + the model in lower case with runs of other characters as
// one '-', + "-<logical cpus>c" (e.g. cpu-amd-epyc-2c).
std::string cpu_profile_name(const CpuMachine& m);

// Today's date in UTC, YYYY-MM-DD.
std::string utc_date();

// Versions of what the CPU path is built with: compiler, Eigen, the MPI library's first line.
std::string cpu_library_versions();

}  // namespace lcplan::profiler
