// The `tessera` subcommands. Each add_*_command registers its options on the CLI11 app and
// returns the function that runs it once parsing succeeded; that function returns the exit code.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace tessera::cli {

using Command = std::function<int()>;

Command add_train_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_import_command(CLI::App& app);
Command add_pipeline_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_swap_plan_command(CLI::App& app);
Command add_peer_command(CLI::App& app);
Command add_swarm_command(CLI::App& app);
Command add_doctor_command(CLI::App& app);

}  // namespace tessera::cli
