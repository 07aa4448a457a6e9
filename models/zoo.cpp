#include "models/zoo.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <tuple>

#include "models/hf_config.h"
#include "common/json_file.h"
#include "common/user_error.h"

namespace lcplan {

namespace {

namespace fs = std::filesystem;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

fs::path zoo_dir(const std::string& data_dir) { return fs::path(data_dir) / "models" / "zoo"; }

// Levenshtein distances from query to every prefix of name: row[k] = lev(query, name[0:k]).
std::vector<size_t> prefix_distances(const std::string& query, const std::string& name) {
  std::vector<size_t> row(name.size() + 1);
  for (size_t j = 0; j <= name.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= query.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= name.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (query[i - 1] != name[j - 1] ? 1u : 0u)});
      diag = up;
    }
  }
  return row;
}

// Up to three zoo names closest to query. Users often type a truncated name ("qwen3.5-35b"), so the primary
// score ignores the unmatched tail of the zoo name (distance to its best prefix); full distance breaks ties.
std::vector<std::string> closest_names(const std::string& query, const std::vector<std::string>& names) {
  std::vector<std::tuple<size_t, size_t, std::string>> scored;
  for (const std::string& n : names) {
    const std::vector<size_t> row = prefix_distances(query, n);
    scored.emplace_back(*std::min_element(row.begin(), row.end()), row.back(), n);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (const auto& [score, full, n] : scored) {
    if (out.size() == 3 || score > std::get<0>(scored.front()) + 2) break;
    out.push_back(n);
  }
  return out;
}

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    throw UserError("model config \"" + path + "\" does not exist (give a zoo name or the path of a config.json)");
  if (fs::is_directory(st))
    throw UserError("model config \"" + path + "\" is a directory (give the config.json inside it, e.g. \"" +
                    (fs::path(path) / "config.json").string() + "\")");
  return read_text_file(path, "model config");  // refuses devices, FIFOs and files above the input size limit
}

bool looks_like_path(const std::string& s) {
  std::error_code ec;
  return s.find('/') != std::string::npos || s.find('\\') != std::string::npos ||
         lower(s).ends_with(".json") || fs::exists(s, ec);
}

}  // namespace

std::vector<std::string> zoo_names(const std::string& data_dir) {
  const fs::path dir = zoo_dir(data_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError("model zoo folder \"" + dir.string() + "\" not found (set LCPLAN_DATA_DIR to the folder holding models/zoo)");
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".json") names.push_back(it->path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec load_model(const std::string& name_or_path, const std::string& data_dir) {
  // A zoo name wins over a same-named file in the working directory; anything path-like is read as a file.
  const std::string key = lower(name_or_path);
  std::error_code ec;
  if (!key.empty() && key.find('/') == std::string::npos && fs::is_directory(zoo_dir(data_dir), ec)) {
    for (const std::string& n : zoo_names(data_dir))
      if (lower(n) == key) return model_from_hf_config_text(read_config_file((zoo_dir(data_dir) / (n + ".json")).string()), n);
  }
  if (looks_like_path(name_or_path)) return model_from_hf_config_text(read_config_file(name_or_path), name_or_path);

  const std::vector<std::string> close = closest_names(key, zoo_names(data_dir));
  std::string list;
  for (const std::string& n : close) list += (list.empty() ? "" : ", ") + n;
  throw UserError("unknown model \"" + name_or_path + "\" (" + (list.empty() ? "" : "closest: " + list + "; ") +
                  "run \"lcplan models\" for the list)");
}

}  // namespace lcplan
