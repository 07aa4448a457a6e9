#include "cli/run_command_line.h"

#include <cstdio>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "common/user_error.h"

namespace lcplan::cli {

namespace {

bool is_help(const std::string& t) { return t == "-h" || t == "--help" || t == "--help-all"; }

// Checks the command line against the registered commands and flags before CLI11 parses it, so every mistake gets
// one sentence naming the flag and what is valid (CLI11's own messages differ in form and miss some cases, e.g.
// `--gpus --seq 128k` takes "--seq" as the value of --gpus). Help requests are left to CLI11.
void check_command_line(const CLI::App& app, int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& t : args)
    if (is_help(t)) return;
  std::string commands;
  const CLI::App* cmd = nullptr;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands += (commands.empty() ? "" : ", ") + sub->get_name();
    if (!args.empty() && sub->get_name() == args[0]) cmd = sub;
  }
  if (args.empty()) throw UserError("no command given (valid: " + commands + "; `lcplan --help` describes them)");
  if (!cmd) throw UserError("unknown command \"" + args[0] + "\" (valid: " + commands + ")");
  // Commands with their own commands (`ingest megatron`): the next argument picks one.
  std::string path = args[0];
  size_t first = 1;
  for (auto subs = cmd->get_subcommands([](const CLI::App*) { return true; }); !subs.empty();
       subs = cmd->get_subcommands([](const CLI::App*) { return true; })) {
    std::string names;
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : subs) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
      if (first < args.size() && sub->get_name() == args[first]) next = sub;
    }
    if (!next && first < args.size())
      throw UserError("unknown " + path + " command \"" + args[first] + "\" (valid: " + names + ")");
    if (!next) throw UserError(path + " needs one of: " + names + " (see `lcplan " + path + " --help`)");
    cmd = next;
    path += " " + args[first++];
  }
  const std::string usage = "see `lcplan " + path + " --help`";
  const CLI::Option* positional = nullptr;  // a command's file arguments (ingest megatron LOG...)
  for (const CLI::Option* opt : cmd->get_options())
    if (opt->get_positional()) positional = opt;

  std::set<const CLI::Option*> given;
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& t = args[i];
    if (positional && !t.empty() && t[0] != '-') {
      given.insert(positional);
      continue;
    }
    if (t.size() > 1 && t[0] == '-' && (t.size() == 2 || t[1] != '-'))
      throw UserError("unknown flag " + t + " for " + path + " (flags start with two dashes; " + usage + ")");
    if (t.rfind("--", 0) != 0 || t == "--")
      throw UserError("unexpected argument \"" + t + "\" for " + path + " (every value follows its flag, e.g. --gpus 32; " +
                      usage + ")");
    const size_t eq = t.find('=');
    const std::string name = t.substr(0, eq);
    const CLI::Option* opt = cmd->get_option_no_throw(name);
    if (!opt) throw UserError("unknown flag " + name + " for " + path + " (" + usage + ")");
    if (!given.insert(opt).second) throw UserError(name + " is given twice (give it once)");
    const bool takes_value = opt->get_items_expected_max() > 0;  // switches expect no items
    // An on/off switch (expects 0 or 1 items) is on alone, else takes the word after it.
    if (takes_value && opt->get_items_expected_min() == 0 && eq == std::string::npos) {
      if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) ++i;
      continue;
    }
    if (!takes_value) {
      if (eq != std::string::npos) throw UserError(name + " is a switch and takes no value (give " + name + " alone)");
      continue;
    }
    // A value is the rest after '=' or the next argument, unless that is the next flag (a value never starts with
    // "--" unless it holds blanks; negative numbers start with one dash and are judged by the flag's own parser).
    std::string value;
    if (eq != std::string::npos) value = t.substr(eq + 1);
    else if (i + 1 < args.size() && (args[i + 1].rfind("--", 0) != 0 || args[i + 1].find_first_of(" \t\n") != std::string::npos))
      value = args[++i];  // a word with blanks is a value even when it starts with "--" (--megatron-args "--tp 2 ...")
    else throw UserError(name + " needs a value: " + opt->get_description());
    if (value.empty()) throw UserError(name + " needs a non-empty value: " + opt->get_description());
    // A list option (several files) takes every following argument up to the next flag.
    if (opt->get_items_expected_max() > 1)
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) ++i;
  }
  for (const CLI::Option* opt : cmd->get_options())
    if (opt->get_required() && !given.count(opt))
      throw UserError(path + " needs " + (opt->get_positional() ? "at least one " + opt->get_name() + " argument"
                                                                : opt->get_name()) + ": " + opt->get_description());
}

}  // namespace

int run_command_line(CLI::App& app, int argc, char** argv, const int& exit_code) {
  try {
    check_command_line(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // check_command_line catches the mistakes we know; anything CLI11 still rejects is worded by CLI11.
    std::fprintf(stderr, "lcplan: error: %s\n", e.what());
    return 2;
  } catch (const UserError& e) {
    std::fprintf(stderr, "lcplan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lcplan: internal error: %s\n", e.what());
    return 3;
  }
  return exit_code;
}

}  // namespace lcplan::cli
