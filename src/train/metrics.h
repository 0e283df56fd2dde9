// metrics.jsonl: one JSON object per line, flushed as written so a crashed run keeps every line
// it logged. Training lines: step, loss, lr, tokens_per_s, mfu, grad_norm, tokens, elapsed_s
// (+ aux_loss for MoE, loss_scale for fp16). Evaluation lines: step, val_loss, elapsed_s.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

class MetricsLog {
 public:
  // A fresh run starts the file anew. A resumed run keeps the lines up to and including
  // `resumed_step` and drops later ones (left by the run it resumes), then appends.
  MetricsLog(const std::string& path, int64_t resumed_step);
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tessera
