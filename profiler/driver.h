// The profile driver: runs the chosen cases on a Device over the launched ranks, derives the coefficients, and
// builds the calibration profile (a copy of the starting profile with the measured coefficients in
// per_hardware[<hardware>], each with provenance "measured: ...", and the raw tables under "profile") and, for the
// CPU backend, the hardware profile of this machine.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/calibration.h"
#include "estimator/hardware.h"
#include "profiler/cases.h"
#include "profiler/device.h"
#include "profiler/profile_data.h"
#include "profiler/shapes.h"

namespace lcplan::profiler {

struct ProfileRun {
  ProfileData data;
  std::string device;                                     // Device::description() of rank 0
  std::vector<std::pair<std::string, double>> case_seconds;  // wall seconds per case
  double seconds = 0;
  int ranks = 1, nodes = 1, ranks_per_node = 1;
};

// Collective over `world`: every rank runs `cases` (names from case_table(); empty = all) in table order.
// `log` receives progress lines (call it on rank 0 only to print once).
ProfileRun run_profile(Device& dev, const comm::Comm& world, const Targets& t, const std::vector<std::string>& cases,
                       const std::function<void(const std::string&)>& log);

// Throws UserError naming the first unknown case (valid: the table's names).
std::vector<std::string> parse_cases(const std::string& list);

struct OutputFacts {
  std::string device;    // "AMD EPYC, 2 logical CPUs, ..." or "NVIDIA H100 80GB HBM3, driver 12.8, ..."
  std::string date;      // YYYY-MM-DD
  std::string command;   // the command line as run
  std::string start;     // the starting profile's name or path
};

// The calibration profile JSON: `start_json` (as read) with per_hardware[hw.name] holding every derived coefficient,
// provenance "measured: <device> <date> `<command>`: <how>", and "profile" holding the raw tables, fits and notes.
// The result is checked with calibration_from_json before it is returned.
nlohmann::json calibration_with_profile(const nlohmann::json& start_json, const Hardware& hw, const ProfileRun& run,
                                        const Derived& derived, const Targets& t, const OutputFacts& f);

// A short human-readable summary of the derived coefficients (printed after the run).
std::string summary_table(const Derived& derived, const Hardware& hw, const ProfileRun& run);

}  // namespace lcplan::profiler
