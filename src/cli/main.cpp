// tessera: train, sample from and prepare data for transformer language models.
// Exit codes: 0 success, 2 a user error (the message names the file, key or rank), 1 an
// unexpected failure.
#include <iostream>

#include <c10/util/Exception.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/process_end.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"tessera: training large language models across devices and hosts, on libtorch"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "print help for every subcommand");
  std::vector<std::pair<CLI::App*, tessera::cli::Command>> commands;
  for (auto add : {tessera::cli::add_train_command, tessera::cli::add_generate_command,
                   tessera::cli::add_prepare_command, tessera::cli::add_bench_command,
                   tessera::cli::add_export_command, tessera::cli::add_inspect_command,
                   tessera::cli::add_import_command, tessera::cli::add_pipeline_command, tessera::cli::add_plan_command,
                   tessera::cli::add_swap_plan_command, tessera::cli::add_peer_command,
                   tessera::cli::add_swarm_command, tessera::cli::add_doctor_command}) {
    size_t before = app.get_subcommands({}).size();
    auto run = add(app);
    commands.emplace_back(app.get_subcommands({})[before], run);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error (libtorch): " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

// Ends by tessera::end_process (core/process_end.h): static destructors cost a third of a start.
int main(int argc, char** argv) { return tessera::end_process(run(argc, argv)); }
