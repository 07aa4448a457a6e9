// Hugging Face config.json -> ModelSpec, using the real field names (nested text_config included).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"

namespace lcplan {

// Throws UserError naming the missing or malformed field.
ModelSpec model_from_hf_config(const nlohmann::json& config, const std::string& name);
ModelSpec model_from_hf_config_text(const std::string& text, const std::string& name);

}  // namespace lcplan
