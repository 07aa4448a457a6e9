// UserError: a mistake in the user's input (flag, file, plan). Its message is one sentence naming the value and
// what would be valid; the CLI prints it and exits non-zero. Everything else that throws is a bug.
#pragma once

#include <stdexcept>
#include <string>

namespace lcplan {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace lcplan
