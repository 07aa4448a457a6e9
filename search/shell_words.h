// Reading a launch command out of shell text, the way bash reads the simple forms real Megatron-LM launch scripts
// use (Megatron-LM examples/*/train_*.sh: variables, arrays of flags, `\` continuations, torchrun in front).
// Not a shell: no commands run, no globbing; what it cannot resolve ($(...), $1, unset variables) stays literal
// and is listed, so a flag whose value needs it can say so in one sentence.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace lcplan {

// Shell variables: a scalar is one value, an array (NAME=( ... )) its elements.
struct ShellVar {
  std::vector<std::string> values;
  bool array = false;
};
using ShellVars = std::map<std::string, ShellVar>;

struct ShellCommand {
  std::vector<std::string> words;       // the command's words after quote removal and expansion
  std::vector<std::string> unresolved;  // expansions left literal ("$DATA_PATH", "$(hostname)"), each once
  ShellVars vars;                       // variables set before the command (a script's assignments)
  int line = 0;                         // 1-based first line of the command in a script (0: not from a script)
};

// Words of one command: quotes, backslash escapes and continuations, comments, $VAR / ${VAR} / ${VAR[@]} /
// ${VAR:-default} / $((arithmetic)) from `vars`; newlines separate words. Stops at the first unquoted ; | & (what
// follows is another command) and drops redirections (2>&1, > file).
ShellCommand shell_words(const std::string& text, const ShellVars& vars = {});

// Throws UserError (one sentence naming `name` and the line) when `text` opens a quote it never closes.
void require_closed_quotes(const std::string& text, const std::string& name);

// The launch command of a script: its assignments (NAME=..., export NAME=..., NAME=( ... ), NAME+=...) are read in
// order, and the first command that runs a Megatron entry point (a pretrain_*.py, torchrun, torch.distributed.run
// or .launch) is returned with its continuation lines, expanded. A text with no such command is read as one command
// (a file of flags). `name` names the file in errors (an unterminated quote).
ShellCommand launch_command_from_script(const std::string& script, const std::string& name);

}  // namespace lcplan
