// Where models/zoo and data/ live: $LCPLAN_DATA_DIR if set, else the source tree lcplan was built from.
#pragma once

#include <cstdlib>
#include <string>

namespace lcplan {

inline std::string data_dir() {
  if (const char* env = std::getenv("LCPLAN_DATA_DIR"); env && *env) return env;
#ifdef LCPLAN_DEFAULT_DATA_DIR
  return LCPLAN_DEFAULT_DATA_DIR;
#else
  return ".";
#endif
}

}  // namespace lcplan
