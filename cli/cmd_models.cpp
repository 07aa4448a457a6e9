// lcplan models: the zoo with total and active parameters.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "common/data_dir.h"
#include "estimator/plan_inputs.h"
#include "models/model_table.h"

namespace lcplan::cli {

void register_models(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("models", "list the model zoo with total and active parameters");
  auto json = std::make_shared<bool>(false);
  auto show = std::make_shared<std::string>();
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->add_option("--show", *show, "one model (zoo name or config.json path): every field lcplan read, and its parameters");
  cmd->callback([json, show, &exit_code]() {
    const std::string dir = data_dir();
    if (!show->empty()) {
      const ModelSpec m = load_named_model(*show, dir);
      std::printf("%s", *json ? (model_details_json(m).dump(2) + "\n").c_str() : model_details(m).c_str());
    } else if (*json) {
      std::printf("%s\n", models_json(dir).dump(2).c_str());
    } else {
      std::printf("%s", models_table(dir).c_str());
    }
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
