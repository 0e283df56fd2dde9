// metrics.jsonl: one JSON object per line, flushed as written so a crashed run keeps every line
// it logged. Training lines: step, loss, lr, tokens_per_s, mfu, grad_norm, tokens, peak_memory_gib,
// elapsed_s (+ aux_loss and moe per layer for MoE, loss_scale for fp16, swarm for a peer).
// Evaluation lines: step, val_loss, eval_s, elapsed_s.
// With `tensorboard`, every line's scalars also go to the run's TensorBoard event file
// (tensorboard/event_file.h), which always holds exactly the lines metrics.jsonl holds.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tensorboard/event_file.h"

namespace tessera {

class MetricsLog {
 public:
  // A fresh run starts the file anew. A resumed run keeps the lines up to and including
  // `resumed_step` and drops later ones (left by the run it resumes), then appends. With
  // `tensorboard` the event file in the same directory is written anew from the kept lines.
  MetricsLog(const std::string& path, int64_t resumed_step, bool tensorboard);
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  std::ofstream out_;
  std::optional<EventFileWriter> events_;
};

}  // namespace tessera
