// Checkpoint directories: RUN_DIR/checkpoints/step_<N>/ holding
//
//   model.safetensors      the model (Hugging Face GPT-2 names for GPT models; see model/hf_names.h)
//   optimizer.safetensors  optimizer state, loss scaler, RNG state: everything a resume needs
//   meta.json              format version, step, resolved config, data position, and for each file
//                          its size and checksum
//   tokenizer files        copied from the data directory so `tessera generate` needs nothing else
//
// Invariants:
// - A checkpoint directory is complete or absent. It is written as step_<N>.partial/, every file
//   fsync'ed, then renamed into place; an existing step_<N> is only moved aside (and then deleted)
//   after its replacement is complete. `latest` (a text file naming the newest step directory) is
//   replaced atomically after the rename.
// - load_checkpoint() verifies the format version and every file's size and checksum before any
//   tensor is used, and names the file that fails.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace tessera {

constexpr int kCheckpointFormatVersion = 1;

struct CheckpointContents {
  NamedTensors model;
  NamedTensors optimizer;
  nlohmann::json meta;                  // caller's fields; save adds format_version, step, files
  std::vector<std::string> extra_files;  // copied in by name (e.g. tokenizer.json)
};

struct LoadedCheckpoint {
  std::string dir;
  int64_t step = 0;
  std::map<std::string, at::Tensor> model;
  std::map<std::string, at::Tensor> optimizer;
  nlohmann::json meta;
};

// Writes checkpoints_dir/step_<step>/ atomically and returns its path.
std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step, const CheckpointContents& contents);

// `path` may be a step directory, a checkpoints directory or a run directory (the latter two
// resolve through `latest`). Throws tessera::Error naming the file on any inconsistency. Every
// file is verified; the optimizer tensors are read only when `with_optimizer` (generation needs
// the model alone).
LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer = true);

// Resolves `path` as load_checkpoint does, without reading tensors.
std::string resolve_checkpoint_dir(const std::string& path);

// Deletes the oldest complete step directories so that at most `keep` remain (keep <= 0: all).
void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep);

}  // namespace tessera
