#include "models/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "models/user_error.h"

namespace lcplan {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(what + " \"" + path + "\" is a directory (expected a JSON file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(what + " \"" + path + "\" cannot be read (missing file or no permission)");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw UserError(what + " \"" + path + "\" is not valid JSON");
  return j;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError("output \"" + path + "\" is a directory (expected a file path)");
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError("output \"" + path + "\" cannot be written (missing directory or no permission)");
    out << content;
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      throw UserError("output \"" + path + "\" could not be written completely (disk full?)");
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw UserError("output \"" + path + "\" could not be replaced (rename failed)");
  }
}

}  // namespace lcplan
