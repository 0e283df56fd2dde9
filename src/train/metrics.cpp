#include "train/metrics.h"

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"

namespace tessera {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t resumed_step, bool tensorboard) : path_(path) {
  if (tensorboard) events_.emplace(std::filesystem::path(path).parent_path().string());
  std::string kept;
  if (resumed_step >= 0) {
    require_regular_file(path);
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object() || parsed.value("step", int64_t{0}) > resumed_step) continue;
      kept += line + "\n";
      if (events_) events_->write(parsed, unix_seconds());
    }
  }
  out_.open(path, std::ios::trunc);
  if (!out_) fail(path, ": cannot open for writing");
  out_ << kept << std::flush;
}

void MetricsLog::write(const nlohmann::json& line) {
  out_ << line.dump() << "\n" << std::flush;
  if (!out_) fail(path_, ": write failed (disk full?)");
  if (events_) events_->write(line, unix_seconds());
}

}  // namespace tessera
