// `tessera doctor RUN_DIR`: after a distributed run failed or hung, which rank stopped where. Reads
// the flight records its ranks wrote into RUN_DIR/flight (comm/flight_recorder.h) and prints, per
// rank, the operation it was in and its last finished one, then the rank the others waited for.
#include <cstdio>

#include "cli/commands.h"
#include "comm/flight_recorder.h"

namespace tessera::cli {

Command add_doctor_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("doctor", "after a failed or hung distributed run: which rank stopped where "
                                               "(reads RUN_DIR/flight)");
  cmd->add_option("run_dir", *run_dir, "the run directory")->required();
  return [run_dir]() {
    const std::vector<nlohmann::json> records = comm::read_flight_records(*run_dir);
    int64_t world = 0;  // every rank any record names
    for (const auto& r : records) {
      world = std::max<int64_t>(world, r["rank"].get<int64_t>() + 1);
      for (const auto& g : r["groups"])
        for (const auto& m : g.value("ranks", nlohmann::json::array())) world = std::max<int64_t>(world, m.get<int64_t>() + 1);
    }
    std::fputs(comm::diagnose_flight_records(records, world).c_str(), stdout);
    return 0;
  };
}

}  // namespace tessera::cli
