// Where models/zoo and data/ live: $LCPLAN_DATA_DIR if set, else the source tree lcplan was built from.
#pragma once

#include <string>

namespace lcplan {

std::string data_dir();

}  // namespace lcplan
