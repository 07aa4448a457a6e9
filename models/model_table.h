// What `lcplan models` prints: the zoo, one row per model, with layer mix, experts and parameter counts.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"

namespace lcplan {

// Layer mix in words, e.g. "30 GDN + 10 attn" or "18 SWA + 18 attn"; MLA models give "61 MLA".
std::string layer_mix(const ModelSpec& m);

// Human-readable table of every zoo model under <data_dir>/models/zoo (parameters in billions, labelled).
std::string models_table(const std::string& data_dir);

// The same rows for --json: [{name, layers, mix, hidden, vocab, experts {...}, params {...}, published {...}, notes}].
nlohmann::json models_json(const std::string& data_dir);

// Everything lcplan read of one model (`lcplan models --show NAME|config.json`): every ModelSpec field, the layer
// pattern in order and the parameter counts by bucket, so a user can check the parse of their config.json.
nlohmann::json model_details_json(const ModelSpec& m);
std::string model_details(const ModelSpec& m);

}  // namespace lcplan
