#include "train/metrics.h"

#include "core/error.h"
#include "core/fs.h"

namespace tessera {

MetricsLog::MetricsLog(const std::string& path, int64_t resumed_step) : path_(path) {
  std::string kept;
  if (resumed_step >= 0) {
    require_regular_file(path);
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object() && parsed.value("step", int64_t{0}) <= resumed_step) kept += line + "\n";
    }
  }
  out_.open(path, std::ios::trunc);
  if (!out_) fail(path, ": cannot open for writing");
  out_ << kept << std::flush;
}

void MetricsLog::write(const nlohmann::json& line) {
  out_ << line.dump() << "\n" << std::flush;
  if (!out_) fail(path_, ": write failed (disk full?)");
}

}  // namespace tessera
