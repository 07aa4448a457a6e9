#include "common/data_dir.h"

#include <cstdlib>

namespace lcplan {

std::string data_dir() {
  if (const char* env = std::getenv("LCPLAN_DATA_DIR"); env && *env) return env;
  return LCPLAN_DEFAULT_DATA_DIR;  // set by common/CMakeLists.txt to the source tree
}

}  // namespace lcplan
