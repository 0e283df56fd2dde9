// tessera: train, sample from and prepare data for transformer language models.
// Exit codes: 0 success, 2 a user error (the message names the file, key or rank), 1 an
// unexpected failure.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include <c10/util/Exception.h>

#include "cli/commands.h"
#include "core/error.h"

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

// The command's own objects are gone when run() returns (run directories unlocked, files closed);
// what is left are static objects, libtorch's operator registry above all, whose destructors cost
// about 85 ms of CPU a process (a third of its start; `make test` starts tessera some 700 times).
// So the process ends with _exit once its output is flushed, except under a sanitizer, whose
// checks at exit then run as usual.
int main(int argc, char** argv) {
  const int code = run(argc, argv);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return code;
#else
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
#endif
}
