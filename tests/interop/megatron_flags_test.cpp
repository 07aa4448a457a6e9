// The Megatron-LM flag table (search/megatron_flags.h): each flag in one row, none both read and "without effect",
// every row complete for its fidelity, Megatron-Bridge field names resolving to their flags, every flag emitted
// declared by a row, and README "Megatron-LM interop" agreeing with the table (its exact rows one table line each,
// in order, naming every flag; the approximate rows' flags under "Read approximately"; the fields without a flag
// under "No Megatron flag").
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "common/user_error.h"
#include "models/zoo.h"
#include "search/megatron_args.h"

namespace lcplan {
namespace {

std::string readme_section(const std::string& title) {
  std::ifstream in(std::string(LCPLAN_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  const size_t start = all.find("\n## " + title + "\n");
  EXPECT_NE(start, std::string::npos) << title;
  if (start == std::string::npos) return "";
  const size_t end = all.find("\n## ", start + 1);
  return all.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// `flag` as a whole word of `text` (not the prefix of a longer flag).
bool names_flag(const std::string& text, const std::string& flag) {
  for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '-' || text[end] == '_'))
      return true;
  }
  return false;
}

std::vector<std::string> flags_in(const std::string& text) {
  std::vector<std::string> out;
  const std::regex flag("--[a-z0-9][a-z0-9-]*");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator(); ++it) out.push_back(it->str());
  return out;
}

TEST(MegatronFlagTable, EachFlagInOneRowAndNeverAlsoWithoutEffect) {
  std::map<std::string, std::string> row_of;
  for (const MegatronRow& r : megatron_rows())
    for (const MegatronFlag& f : r.flags) {
      EXPECT_TRUE(row_of.emplace(f.name, r.field).second) << f.name << " in " << row_of[f.name] << " and " << r.field;
      EXPECT_FALSE(megatron_flag_without_effect(f.name)) << f.name << " is read and also listed without effect";
      EXPECT_EQ(find_megatron_flag(f.name), &f);
    }
  EXPECT_EQ(find_megatron_flag("--frobnicate"), nullptr);
}

// lcplan's run-setting flags come from the rows (cli/plan_flags.cpp adds one option each): unique, never a Megatron
// flag of another row's meaning, and bad text is one UserError sentence, not a crash or a silent default.
TEST(MegatronFlagTable, LcplanFlagsAreUniqueAndRefuseBadText) {
  std::set<std::string> names;
  size_t count = 0;
  for (const MegatronRow& r : megatron_rows())
    for (const LcplanFlag& f : r.lcplan) {
      SCOPED_TRACE(f.name);
      ++count;
      EXPECT_TRUE(names.insert(f.name).second);
      EXPECT_TRUE(f.apply && f.help && std::string(f.name).rfind("--", 0) == 0);
      if (const MegatronFlag* m = find_megatron_flag(f.name)) {  // same spelling as Megatron's: the same row
        bool same_row = false;
        for (const MegatronFlag& g : r.flags) same_row |= &g == m;
        EXPECT_TRUE(same_row) << "lcplan's " << f.name << " means another row's Megatron flag";
      }
      Plan p;
      EXPECT_THROW(f.apply(p, "x?"), UserError);
    }
  EXPECT_EQ(count, 29u);  // the 22 run-setting flags estimate and search had before they moved into the rows, --hybrid-cp,
                          // --rank-capacity-factor, --paged-stash, --dist-opt-instances, --offload-modules-fraction,
                          // --microbatch-group, --distribute-saved-activations
}

TEST(MegatronFlagTable, RowsAreCompleteForTheirFidelity) {
  for (const MegatronRow& r : megatron_rows()) {
    SCOPED_TRACE(r.field);
    const std::string field = r.field;
    switch (r.fidelity) {
      case Fidelity::Exact:
        if (field.rfind("model", 0) == 0) break;  // the model's shape: megatron_args.h reads and writes it
        EXPECT_TRUE(r.read && r.emit && r.expressed);
        EXPECT_EQ(std::string(r.note), "");
        break;
      case Fidelity::Approximate:
        EXPECT_TRUE(r.read && !r.expressed);
        EXPECT_FALSE(std::string(r.note).empty());
        EXPECT_FALSE(r.flags.empty());
        break;
      case Fidelity::NoFlag:
        EXPECT_TRUE(r.emit && !r.expressed);  // named in the emitted comment lines, never compared
        EXPECT_FALSE(std::string(r.note).empty());
        break;
    }
  }
}

TEST(MegatronFlagTable, BridgeFieldsResolveToTheirFlags) {
  EXPECT_EQ(std::string(find_bridge_field("tensor_model_parallel_size")->name), "--tensor-model-parallel-size");
  EXPECT_EQ(std::string(find_bridge_field("num_moe_experts")->name), "--num-experts");
  EXPECT_EQ(std::string(find_bridge_field("virtual_pipeline_model_parallel_size")->name), "--num-virtual-stages-per-pipeline-rank");
  EXPECT_EQ(std::string(find_bridge_field("share_embeddings_and_output_weights")->name), "--untie-embeddings-and-output-weights");
  EXPECT_EQ(find_bridge_field("lr"), nullptr);  // known to Megatron, without effect: not a row's
  for (const MegatronRow& r : megatron_rows())
    for (const MegatronFlag& f : r.flags) {
      if (f.bridge) {
        EXPECT_EQ(find_bridge_field(f.bridge[0] == '!' ? f.bridge + 1 : f.bridge), &f) << f.bridge;
      }
    }
}

// Plans that take every branch of the emitters: each flag they print is a row's.
TEST(MegatronFlagTable, EveryEmittedFlagIsARows) {
  const ModelSpec qwen = load_model("qwen3-30b-a3b", LCPLAN_SOURCE_DIR), llama = load_model("llama-3.1-70b", LCPLAN_SOURCE_DIR);
  std::vector<std::pair<Plan, const ModelSpec*>> plans;
  Plan p;
  p.model = "qwen3-30b-a3b", p.gpus = 64, p.seq_len = 32768;
  p.parallel = {2, 2, 2, 2, 8, 2}, p.optimizer_sharding = OptimizerSharding::Fsdp, p.recompute = Recompute::Selective;
  p.linear_ce = true, p.moe.capacity_factor = 1.25, p.moe.dispatcher = MoeDispatcher::DeepEP, p.moe.a2a_overlap = true;
  p.precision = Precision::MXFP8, p.mtp_layers = 1, p.moe.ep_chunks = 2;
  plans.push_back({p, &qwen});
  p.parallel = {1, 1, 1, 1, 8, 1}, p.optimizer_sharding = OptimizerSharding::None, p.recompute = Recompute::Full;
  p.offload = {true, true}, p.precision = Precision::NVFP4, p.moe.dispatcher = MoeDispatcher::AllToAll;
  plans.push_back({p, &qwen});
  Plan q;
  q.model = "llama-3.1-70b", q.gpus = 64, q.seq_len = 8192, q.parallel = {8, 4, 1, 1, 1, 1}, q.recompute = Recompute::Full;
  q.recompute_layers = 2, q.precision = Precision::FP8;
  for (const PipelineLayout& pl : {PipelineLayout{}, PipelineLayout{18, 18, {}}, PipelineLayout{0, 0, {17, 21, 21, 21}}})
    for (int vpp : {1, 2}) {
      q.pipeline = pl, q.parallel.vpp = pl.chunk_layers.empty() ? vpp : 1;
      plans.push_back({q, &llama});
    }
  for (const auto& [plan, model] : plans) {
    const std::string flags = megatron_flags(plan, *model);
    const std::string line = flags.substr(0, flags.find('\n'));
    for (const std::string& f : flags_in(line)) EXPECT_NE(find_megatron_flag(f), nullptr) << f << " in " << line;
    EXPECT_NE(flags.find("\n# no Megatron flag: hardware"), std::string::npos) << flags;
  }
}

// The README's mapping table: "| <field> | <flags and words> |" lines, first cell without backticks.
std::vector<std::pair<std::string, std::string>> readme_rows(const std::string& section) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::istringstream in(section);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0 || line.rfind("| plan field", 0) == 0) continue;
    std::string field = line.substr(2, line.find(" | ") - 2);
    field.erase(std::remove(field.begin(), field.end(), '`'), field.end());
    rows.push_back({field, line});
  }
  return rows;
}

TEST(MegatronFlagTable, ReadmeAgrees) {
  const std::string section = readme_section("Megatron-LM interop");
  const auto table = readme_rows(section);
  const size_t no_flag = section.find("**No Megatron flag**"), approx = section.find("Read approximately (");
  ASSERT_NE(no_flag, std::string::npos);
  ASSERT_NE(approx, std::string::npos);
  const std::string no_flag_text = section.substr(no_flag, section.find("\n\n", no_flag) - no_flag);
  const std::string approx_text = section.substr(approx, section.find("\n\n", approx) - approx);
  size_t next = 0;
  std::set<std::string> read;
  for (const MegatronRow& r : megatron_rows()) {
    SCOPED_TRACE(r.field);
    for (const MegatronFlag& f : r.flags) read.insert(f.name);
    if (r.fidelity == Fidelity::NoFlag) {
      EXPECT_NE(no_flag_text.find("`" + std::string(r.field) + "`"), std::string::npos) << no_flag_text;
      for (const MegatronFlag& f : r.flags) EXPECT_TRUE(names_flag(no_flag_text, f.name)) << f.name;
      continue;
    }
    if (r.fidelity == Fidelity::Approximate) {
      for (const MegatronFlag& f : r.flags) EXPECT_TRUE(names_flag(approx_text, f.name)) << f.name;
      continue;
    }
    // Exact: the next table line is the row's, and names each of its flags.
    ASSERT_LT(next, table.size()) << "README's table has no line for it";
    EXPECT_EQ(table[next].first, r.field) << table[next].second;
    for (const MegatronFlag& f : r.flags) EXPECT_TRUE(names_flag(table[next].second, f.name)) << f.name << "\n" << table[next].second;
    ++next;
  }
  EXPECT_EQ(next, table.size()) << "README's table has a line no row of the table has: " << table[std::min(next, table.size() - 1)].second;
  for (const auto& [field, line] : table)
    for (const std::string& f : flags_in(line)) EXPECT_TRUE(read.count(f)) << f << " is in README's table but no row reads it";
}

}  // namespace
}  // namespace lcplan
