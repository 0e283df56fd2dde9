// libFuzzer target: a run's configuration as a user gives it, a TOML file and `--set key=value`
// overrides (config/config.h, Config::load), or as a checkpoint records it (a meta.json whose
// "config" is the TOML text, Config::from_checkpoint_meta). The input is the TOML text, then, after
// a line "%%", one override per line; its first byte chooses the file or the meta.json path. A
// config that loads is written back as annotated TOML and must load again. Every input must load
// or end in tessera::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool from_meta = data[0] & 1;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t split = input.find("\n%%\n");
  const std::string toml = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    std::istringstream lines(input.substr(split + 4));
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  static const std::string dir = "/tmp/tessera-fuzz-config-" + std::to_string(getpid());
  static const bool made = [] { return system(("mkdir -p " + dir).c_str()) == 0; }();
  if (!made) __builtin_trap();
  try {
    tessera::Config config;
    if (from_meta) {
      tessera::fuzz::write_file(dir + "/meta.json", nlohmann::json({{"config", toml}}).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      config = tessera::Config::from_checkpoint_meta(dir + "/meta.json", overrides);
    } else {
      tessera::fuzz::write_file(dir + "/run.toml", toml);
      config = tessera::Config::load(dir + "/run.toml", overrides);
    }
    tessera::fuzz::write_file(dir + "/again.toml", config.to_annotated_toml());
    try {
      tessera::Config::load(dir + "/again.toml", {});
    } catch (const tessera::Error&) {
      __builtin_trap();  // a loaded config must survive being written back
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
