// The model zoo: HF-style config.json files under models/zoo/<name>.json, and loading a model by name or path.
#pragma once

#include <string>
#include <vector>

#include "models/model_spec.h"

namespace lcplan {

// Zoo names (file stems under <data_dir>/models/zoo), sorted.
std::vector<std::string> zoo_names(const std::string& data_dir);

// A zoo name (case-insensitive) or a path to a config.json. Throws UserError: unknown names list the close ones.
ModelSpec load_model(const std::string& name_or_path, const std::string& data_dir);

}  // namespace lcplan
