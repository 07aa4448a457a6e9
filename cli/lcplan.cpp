// lcplan: plan long-context MoE training. `lcplan <command> --help` for each command.
#include <cstdio>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/user_error.h"

namespace {

using lcplan::UserError;

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
    const bool takes_value = opt->get_items_expected_min() > 0;  // switches expect no items
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

int main(int argc, char** argv) {
  CLI::App app{"lcplan: memory and speed of parallel recipes for long-context MoE training"};
  app.require_subcommand(1);
  int exit_code = 0;
  lcplan::cli::register_models(app, exit_code);
  lcplan::cli::register_estimate(app, exit_code);
  lcplan::cli::register_search(app, exit_code);
  lcplan::cli::register_report(app, exit_code);
  lcplan::cli::register_tune(app, exit_code);
  lcplan::register_calibrate(app, exit_code);
  lcplan::register_validate(app, exit_code);
  lcplan::register_ingest(app, exit_code);
#ifdef LCPLAN_WITH_EXECUTOR
  lcplan::cli::register_diff(app, exit_code);
#endif
  // lcplan --version: the release and the commit it was built from (CMake reads it when the build is configured).
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("lcplan %s (commit %s)\n", LCPLAN_VERSION, LCPLAN_GIT_COMMIT);
    return 0;
  }
#ifdef LCPLAN_HAVE_PROFILER
  std::string command = "lcplan";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    command += " " + (a.find_first_of(" \t'\"") == std::string::npos && !a.empty() ? a : "'" + a + "'");
  }
  lcplan::register_profile(app, exit_code, command);
  lcplan::register_selftest(app, exit_code);
#endif
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
  } catch (const lcplan::UserError& e) {
    std::fprintf(stderr, "lcplan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lcplan: internal error: %s\n", e.what());
    return 3;
  }
  return exit_code;
}
