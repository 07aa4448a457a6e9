// lcplan: plan long-context MoE training. `lcplan <command> --help` for each command.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "models/user_error.h"

int main(int argc, char** argv) {
  CLI::App app{"lcplan: memory and speed of parallel recipes for long-context MoE training"};
  app.require_subcommand(1);
  int exit_code = 0;
  lcplan::cli::register_models(app, exit_code);
  lcplan::cli::register_estimate(app, exit_code);
  lcplan::cli::register_search(app, exit_code);
  lcplan::register_calibrate(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
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
