// `lcplan models`: one row per zoo model in the table and in the JSON.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "models/model_table.h"
#include "models/params.h"
#include "models/zoo.h"

namespace lcplan {
namespace {

std::string data_root() {
  const char* env = std::getenv("LCPLAN_DATA_DIR");
  return env && *env ? env : LCPLAN_SOURCE_DIR;
}

TEST(ModelTable, OneRowPerZooModel) {
  const std::string table = models_table(data_root());
  std::printf("%s", table.c_str());
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);
  EXPECT_NE(line.find("published"), std::string::npos);
  for (const std::string& name : zoo_names(data_root())) {
    ASSERT_TRUE(std::getline(lines, line));
    EXPECT_EQ(line.rfind(name + " ", 0), 0u) << line;
  }
  EXPECT_NE(table.find("40 = 30 GDN + 10 attn, +1 MTP"), std::string::npos);
  EXPECT_NE(table.find("61 = 61 MLA (3 dense FFN), +1 MTP"), std::string::npos);
  EXPECT_NE(table.find("46.7 / 12.9"), std::string::npos);
}

TEST(ModelTable, JsonRowsAgreeWithCounts) {
  const nlohmann::json rows = models_json(data_root());
  ASSERT_EQ(rows.size(), zoo_names(data_root()).size());
  for (const auto& r : rows) {
    const ModelSpec m = load_model(r["name"], data_root());
    EXPECT_DOUBLE_EQ(r["params"]["total"].get<double>(), count_params(m).total);
    EXPECT_EQ(r["layers"].get<size_t>(), m.layers.size());
    const auto& mix = r["mix"];
    EXPECT_EQ(mix["full_attention"].get<int>() + mix["sliding_attention"].get<int>() + mix["linear_attention"].get<int>() +
                  mix["mla"].get<int>(),
              int(m.layers.size()));
  }
  EXPECT_TRUE(rows[0]["published"]["total"].is_number());
}

}  // namespace
}  // namespace lcplan
