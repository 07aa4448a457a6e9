// The folders are the design's boxes and depend downward only (README "Layout"): every #include "folder/..." in a
// source file is checked against the allowed edges below, and no two folders may include each other.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace fs = std::filesystem;

namespace {

// Folder -> folders its sources may include. Order: common <- models <- parallel <- estimator <- calibrate/search
// <- report/tune; parallel <- kernels <- profiler/executor; cli and python on top.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> a = {
      {"common", {}},
      {"models", {"common"}},
      {"parallel", {"common"}},
      {"estimator", {"common", "models", "parallel"}},
      {"calibrate", {"common", "models", "parallel", "estimator"}},
      {"search", {"common", "models", "parallel", "estimator"}},
      {"report", {"common", "models", "parallel", "estimator", "calibrate", "search"}},
      {"tune", {"common", "models", "parallel", "estimator", "calibrate", "search"}},
      {"kernels", {"common", "parallel"}},
      {"profiler", {"common", "models", "parallel", "estimator", "calibrate", "kernels"}},
      {"executor", {"common", "models", "parallel", "estimator", "calibrate", "kernels"}},
      {"cli", {"common", "models", "parallel", "estimator", "calibrate", "search", "report", "tune", "kernels",
               "profiler", "executor"}},
      {"python", {"common", "models", "parallel", "estimator", "calibrate", "search", "report"}},
  };
  return a;
}

struct Edge {
  std::string from, to, where;
};

std::vector<Edge> include_edges(const fs::path& root) {
  static const std::regex inc(R"(^\s*#\s*include\s+"([A-Za-z_]+)/)");
  std::vector<Edge> out;
  for (const auto& [folder, _] : allowed()) {
    if (!fs::is_directory(root / folder)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
      const auto ext = e.path().extension();
      if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (std::regex_search(line, m, inc) && m[1] != folder && allowed().count(m[1]))
          out.push_back({folder, m[1], fs::relative(e.path(), root).string() + ":" + std::to_string(n)});
      }
    }
  }
  return out;
}

TEST(IncludeGraph, EveryIncludePointsDown) {
  const auto edges = include_edges(LCPLAN_SOURCE_DIR);
  ASSERT_FALSE(edges.empty());  // the scan found the sources
  std::string bad;
  for (const Edge& e : edges)
    if (!allowed().at(e.from).count(e.to)) bad += "  " + e.where + ": " + e.from + "/ includes " + e.to + "/\n";
  EXPECT_TRUE(bad.empty()) << "includes against the folder order (README \"Layout\"):\n" << bad;
}

TEST(IncludeGraph, NoTwoFoldersIncludeEachOther) {
  std::set<std::pair<std::string, std::string>> seen;
  for (const Edge& e : include_edges(LCPLAN_SOURCE_DIR)) seen.insert({e.from, e.to});
  for (const auto& [a, b] : seen) EXPECT_FALSE(seen.count({b, a})) << a << "/ and " << b << "/ include each other";
}

// The table itself is acyclic, so passing the first test rules out cycles of any length.
TEST(IncludeGraph, AllowedOrderIsAcyclic) {
  std::map<std::string, int> state;  // 0 new, 1 on the stack, 2 done
  std::function<bool(const std::string&)> cyclic = [&](const std::string& f) {
    if (state[f] == 1) return true;
    if (state[f] == 2) return false;
    state[f] = 1;
    for (const auto& g : allowed().at(f))
      if (cyclic(g)) return true;
    state[f] = 2;
    return false;
  };
  for (const auto& [f, _] : allowed()) EXPECT_FALSE(cyclic(f)) << f;
}

}  // namespace
