// Files a user gives us or asks for: reading (directories, devices, FIFOs, oversized, unreadable files and invalid
// JSON become one UserError sentence) and writing (atomically, never a partial file, never over a non-regular file).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lcplan {

// Largest input file read: every real input (config.json, recipe, calibration, measurements) is a few hundred KiB,
// and a limit turns `--plan /dev/zero`-like mistakes into an error instead of exhausting memory.
inline constexpr std::int64_t kMaxInputFileBytes = std::int64_t(64) << 20;

// The whole content of a regular file of at most kMaxInputFileBytes. `what` names it in errors ("plan file").
std::string read_text_file(const std::string& path, const std::string& what);

nlohmann::json read_json_file(const std::string& path, const std::string& what);

// Writes `content` to a new temporary file in the target's directory, syncs it, then renames it over the target:
// readers never see a partial file, and a failed write leaves the old file intact. A symlink target keeps the link
// and replaces the file it points to; an existing file keeps its mode. Throws UserError naming the path for an
// empty path, a target that is not a regular file (directory, device, FIFO), or any failing system call.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace lcplan
