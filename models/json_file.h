// Files a user gives us or asks for: reading (directories, unreadable files and invalid JSON become one UserError
// sentence) and writing (atomically, never a partial file).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace lcplan {

nlohmann::json read_json_file(const std::string& path, const std::string& what);

// Writes `content` to a temporary file beside `path`, then renames it over `path`: readers never see a partial file,
// and a failed write leaves the old file intact. Throws UserError naming the path.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace lcplan
