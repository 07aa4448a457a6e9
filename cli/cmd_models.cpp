// lcplan models: the zoo with total and active parameters.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "common/data_dir.h"
#include "models/model_table.h"

namespace lcplan::cli {

void register_models(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("models", "list the model zoo with total and active parameters");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([json, &exit_code]() {
    const std::string dir = data_dir();
    if (*json) std::printf("%s\n", models_json(dir).dump(2).c_str());
    else std::printf("%s", models_table(dir).c_str());
    exit_code = 0;
  });
}

}  // namespace lcplan::cli
