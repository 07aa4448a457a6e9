// The model zoo: every file parses, carries its provenance, and its parameter counts match what the publisher states.
//
// Rule for comparing with published figures (printed as a table by AllModelsMatchPublishedFigures):
//  * precise (publisher states >= 3 significant figures): ours within 2% of the figure.
//  * name only (e.g. "35B-A3B"): the figure is rounded to the last digit written, and multimodal checkpoints add a
//    vision tower we do not model, so ours must be within max(0.5B, 2%) of the figure; the figure must equal the one
//    the zoo name spells out.
//  * active counts follow the publisher's stated or inferred convention, recorded in published.active_counts:
//    "all" (embedding and LM head included), "no_input_embedding", or "no_embedding_or_head".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "models/model_table.h"
#include "models/params.h"
#include "common/user_error.h"
#include "models/zoo.h"

namespace lcplan {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string data_root() {
  const char* env = std::getenv("LCPLAN_DATA_DIR");
  return env && *env ? env : LCPLAN_SOURCE_DIR;
}

json zoo_file(const std::string& name) {
  std::ifstream in(data_root() + "/models/zoo/" + name + ".json");
  return json::parse(in);
}

std::string load_error(const std::string& what) {
  try {
    load_model(what, data_root());
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Zoo, HasTheEighteenModels) {
  const std::vector<std::string> want = {"deepseek-v3", "glm-4.5", "glm-4.5-air", "gpt-oss-120b", "gpt-oss-20b",
                                         "kimi-k2", "llama-3.1-405b", "llama-3.1-70b", "llama-3.1-8b", "mixtral-8x22b",
                                         "mixtral-8x7b", "moonlight-16b-a3b", "qwen2-57b-a14b", "qwen3-235b-a22b",
                                         "qwen3-30b-a3b", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b"};
  EXPECT_EQ(zoo_names(data_root()), want);
}

TEST(Zoo, EveryFileCarriesProvenance) {
  for (const std::string& name : zoo_names(data_root())) {
    SCOPED_TRACE(name);
    const json meta = zoo_file(name).at("_lcplan");
    EXPECT_EQ(meta.at("name"), name);
    EXPECT_TRUE(meta.at("hf_id").is_string() && !meta["hf_id"].get<std::string>().empty());
    ASSERT_TRUE(meta.at("sources").is_array());
    EXPECT_FALSE(meta["sources"].empty());
    const json& pub = meta.at("published");
    EXPECT_TRUE(pub.at("precise").is_boolean());
    EXPECT_FALSE(pub.at("source").get<std::string>().empty());
    EXPECT_TRUE(pub.at("total_params").is_number());
    const ModelSpec m = load_model(name, data_root());
    EXPECT_EQ(m.notes, meta.at("reliability").get<std::string>());
    EXPECT_EQ(m.name, name);
  }
}

double active_under(const ParamCounts& c, const std::string& convention) {
  if (convention == "all") return c.active;
  if (convention == "no_input_embedding") return c.active - c.embedding;
  if (convention == "no_embedding_or_head") return c.active - c.embedding - c.lm_head;
  ADD_FAILURE() << "unknown active_counts convention " << convention;
  return 0;
}

// The figures a name like "qwen3.5-35b-a3b" spells out (35e9, 3e9); zeros when the name has none.
std::pair<double, double> name_figures(const std::string& name) {
  std::smatch m;
  if (!std::regex_search(name, m, std::regex(R"(-(\d+)b(?:-a(\d+)b)?$)"))) return {0, 0};
  return {std::stod(m[1]) * 1e9, m[2].matched ? std::stod(m[2]) * 1e9 : 0};
}

TEST(Zoo, AllModelsMatchPublishedFigures) {
  std::printf("\n%-20s %10s %10s %7s  %10s %10s %7s  %-20s %s\n", "model", "ours tot B", "pub tot B", "diff", "ours act B",
              "pub act B", "diff", "active counts", "basis");
  for (const std::string& name : zoo_names(data_root())) {
    SCOPED_TRACE(name);
    const ModelSpec m = load_model(name, data_root());
    const ParamCounts c = count_params(m);
    const json pub = zoo_file(name)["_lcplan"]["published"];
    const bool precise = pub["precise"].get<bool>();
    const std::string convention = pub.value("active_counts", "all");
    const double ours_active = active_under(c, convention);
    auto tolerance = [&](double figure) { return precise ? 0.02 * figure : std::max(0.5e9, 0.02 * figure); };
    auto diff = [](double ours, double figure) { return figure > 0 ? 100.0 * (ours - figure) / figure : 0.0; };

    ASSERT_GT(m.published_total_params, 0);
    EXPECT_NEAR(c.total, m.published_total_params, tolerance(m.published_total_params));
    if (m.published_active_params > 0) {
      EXPECT_NEAR(ours_active, m.published_active_params, tolerance(m.published_active_params));
    } else {
      EXPECT_EQ(m.moe.num_experts, 0) << "an MoE model needs a published active figure";
    }
    if (!precise) {
      const auto [total, active] = name_figures(name);
      ASSERT_GT(total, 0) << "a name-only figure needs a name that spells it out";
      EXPECT_DOUBLE_EQ(m.published_total_params, total);
      if (active > 0) {
        EXPECT_DOUBLE_EQ(m.published_active_params, active);
      }
    }
    std::printf("%-20s %10.2f %10.2f %6.1f%%  %10.2f %10s %6.1f%%  %-20s %s\n", name.c_str(), c.total / 1e9,
                m.published_total_params / 1e9, diff(c.total, m.published_total_params), ours_active / 1e9,
                m.published_active_params > 0 ? std::to_string(m.published_active_params / 1e9).substr(0, 6).c_str() : "-",
                diff(ours_active, m.published_active_params), convention.c_str(), precise ? "precise" : "name");
  }
}

TEST(Zoo, LayerMixMatchesTheReference) {
  // Layer patterns stated in the reference (shared/reference/model-architectures.json).
  const std::vector<std::pair<std::string, std::string>> want = {
      {"qwen3.5-35b-a3b", "30 GDN + 10 attn"}, {"qwen3.5-397b-a17b", "45 GDN + 15 attn"},
      {"qwen3-next-80b-a3b", "36 GDN + 12 attn"}, {"gpt-oss-120b", "18 SWA + 18 attn"}, {"gpt-oss-20b", "12 SWA + 12 attn"},
      {"deepseek-v3", "61 MLA"}, {"llama-3.1-405b", "126 attn"}};
  for (const auto& [name, mix] : want) EXPECT_EQ(layer_mix(load_model(name, data_root())), mix) << name;
  const ModelSpec ds = load_model("deepseek-v3", data_root());
  EXPECT_EQ(std::count_if(ds.layers.begin(), ds.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::Dense; }), 3);
  const ModelSpec kimi = load_model("kimi-k2", data_root());
  EXPECT_EQ(kimi.layers[0].ffn, FfnKind::Dense);
  EXPECT_EQ(kimi.layers[1].ffn, FfnKind::MoE);
  EXPECT_EQ(load_model("moonlight-16b-a3b", data_root()).mla.q_lora_rank, 0);
}

TEST(ZooLoad, NamesAreCaseInsensitive) {
  const ModelSpec m = load_model("DeepSeek-V3", data_root());
  EXPECT_EQ(m.name, "deepseek-v3");
  EXPECT_EQ(m.layers.size(), 61u);
}

TEST(ZooLoad, PathToConfigJson) {
  const std::string path = data_root() + "/models/zoo/mixtral-8x7b.json";
  const ModelSpec m = load_model(path, data_root());
  EXPECT_EQ(m.name, path);
  EXPECT_DOUBLE_EQ(count_params(m).total, count_params(load_model("mixtral-8x7b", data_root())).total);
}

TEST(ZooLoad, UnknownNameSuggestsClosest) {
  EXPECT_EQ(load_error("qwen3.5-35b"),
            "unknown model \"qwen3.5-35b\" (closest: qwen3.5-35b-a3b, qwen3.5-397b-a17b; run \"lcplan models\" for the list)");
  EXPECT_NE(load_error("deepseek").find("closest: deepseek-v3;"), std::string::npos);
  EXPECT_NE(load_error("llama3.1-70b").find("closest: llama-3.1-70b,"), std::string::npos);
  EXPECT_NE(load_error("mixtral").find("closest: mixtral-8x7b, mixtral-8x22b;"), std::string::npos);
}

TEST(ZooLoad, BadPathsGiveOneSentence) {
  const fs::path dir = fs::temp_directory_path() / ("lcplan-zoo-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_NE(load_error(dir.string()).find("is a directory"), std::string::npos);
  EXPECT_NE(load_error((dir / "missing.json").string()).find("does not exist"), std::string::npos);
  const fs::path bad = dir / "config.json";
  std::ofstream(bad) << "{\"hidden_size\": 8,";
  EXPECT_NE(load_error(bad.string()).find("is not valid JSON"), std::string::npos);
  std::ofstream(bad) << "{\"vocab_size\": 8}";
  EXPECT_NE(load_error(bad.string()).find("\"hidden_size\" is missing"), std::string::npos);
  for (const std::string& msg : {load_error(dir.string()), load_error(bad.string())})
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  fs::remove_all(dir);
}

TEST(ZooLoad, MissingZooFolder) {
  EXPECT_THROW(zoo_names("/nonexistent-lcplan-data"), UserError);
  try {
    load_model("qwen3.5-35b", "/nonexistent-lcplan-data");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("LCPLAN_DATA_DIR"), std::string::npos);
  }
}

}  // namespace
}  // namespace lcplan
