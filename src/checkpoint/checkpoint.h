// Checkpoint directories: RUN_DIR/checkpoints/step_<N>/ holding
//
//   model.safetensors      the model (Hugging Face GPT-2 names for GPT models; see model/hf_names.h)
//   optimizer.safetensors  optimizer state, loss scaler, RNG state: everything a resume needs
//   meta.json              format version, step, resolved config, data position, and for each file
//                          its size and checksum
//   tokenizer files        copied from the data directory so `tessera generate` needs nothing else
//
// A multi-rank checkpoint writes the model as one file per rank, in Hugging Face's sharded layout,
//   model-00001-of-0000N.safetensors ...   whole tensors, each written by the one rank that owns it
//                                          (no rank ever holds the whole model to save it), and
//                                          under tensor parallelism each rank's part of a split
//                                          tensor, with its region's record in the file's metadata
//                                          (region.h; no rank gathers a split tensor to save it)
//   model.safetensors.index.json           {"metadata": {"total_size"}, "weight_map": {name: file}}
//                                          for the whole tensors, and "part_map": {name: [files]}
//                                          for those written in parts; made by commit_checkpoint
//                                          from the shards' headers
// (meta.json records model_shards = N; load_checkpoint merges them, assembling parts; without
// parts the directory loads in Hugging Face's transformers as it is, and `tessera export` writes
// one model.safetensors in every case), and replaces optimizer.safetensors by one shard per rank,
//   optimizer-<r>-of-<N>.safetensors   regions of the optimizer tensors, each 1-D with its record
//                                      (region.h) in the metadata: rank r's even slice of each,
//                                      what rank r owns under ZeRO, its tensor-parallel part or
//                                      its ZeRO range of that part: any split that covers every
//                                      element exactly once
// written by every rank into the same step_<N>.partial/ (prepare_checkpoint_dir on rank 0, a
// barrier, write_optimizer_shard everywhere, a barrier, commit_checkpoint on rank 0). meta.json
// is written last, after all shards, and lists them with their checksums: it is the commit
// marker, and the rename into place makes the step visible. load_checkpoint reassembles whole
// tensors from the shards, or reads only the ranges a resuming rank owns (`ranges`), so the
// checkpoint resumes at any number of ranks.
//
// State that only its own rank holds (gradient-compression residuals, which differ between ranks)
// goes into one file per rank,
//   compression-<r>-of-<N>.safetensors   rank r's state, whole
// written by each rank next to its optimizer shard (write_compression_state); commit_checkpoint
// requires all N of them when contents.compression_ranks = N and records the count in meta.json.
//
// Invariants:
// - A checkpoint directory is complete or absent. It is written as step_<N>.partial/, every file
//   fsync'ed, then renamed into place; an existing step_<N> is only moved aside (and then deleted)
//   after its replacement is complete. `latest` (a text file naming the newest step directory) is
//   replaced atomically after the rename.
// - load_checkpoint() verifies the format version, meta.json's own checksum ("meta_checksum", over
//   its other fields) and every file's size and checksum before any tensor is used, and names the
//   file that fails. It validates every field it reads: types, a step >= 0 that agrees with a
//   step_<N> directory name, file entries. Each tensor it reads is checked by its kind
//   (core/state_kind.h), which the reader's components declare (StateKinds; this layer knows no
//   component's names): model tensors and real state floating point and finite, second moments
//   also non-negative, counters non-negative integers (or finite floats), random-generator bytes
//   unchecked. A checkpoint that would resume into NaN is refused naming the file and tensor.
#pragma once

#include <cmath>
#include <functional>
#include <set>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/region.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/state_kind.h"

namespace tessera {

constexpr int kCheckpointFormatVersion = 2;

// A field of meta.json (or of an object in it), checked for its type: int64_t (an integer),
// double (a finite number), std::string, nlohmann::json (an object). Throws naming `path` and
// `key` when it is missing or of another type.
template <class T>
T meta_field(const nlohmann::json& meta, const char* key, const std::string& path) {
  const auto it = meta.find(key);
  bool ok = it != meta.end();
  if constexpr (std::is_same_v<T, int64_t>) ok = ok && it->is_number_integer();
  else if constexpr (std::is_same_v<T, double>) ok = ok && it->is_number() && std::isfinite(it->template get<double>());
  else if constexpr (std::is_same_v<T, std::string>) ok = ok && it->is_string();
  else ok = ok && it->is_object();
  require(ok, path, ": '", key, "' is missing or of the wrong type");
  return it->template get<T>();
}  // 2: meta.json carries meta_checksum

struct CheckpointContents {
  NamedTensors model;
  NamedTensors optimizer;
  nlohmann::json meta;                  // caller's fields; save adds format_version, step, files
  std::vector<std::string> extra_files;  // copied in by name (e.g. tokenizer.json)
  std::vector<std::pair<std::string, std::string>> extra_texts;  // name, bytes: written in as files
  int64_t compression_ranks = 0;         // > 0: compression-<r>-of-<N> files every rank wrote
  int64_t model_shards = 0;              // > 0: model-<r+1>-of-<N> files every rank wrote; `model` unused
};

// Where a model tensor, or a part of it, is stored: a file and the region (region.h) it holds.
struct StoredPiece {
  std::string file;
  Region region;
};

struct LoadedCheckpoint {
  std::string dir;
  int64_t step = 0;
  std::map<std::string, at::Tensor> model;              // empty when loaded without the model
  std::map<std::string, std::vector<StoredPiece>> model_files;  // every model tensor's pieces (always filled)
  std::map<std::string, at::Tensor> optimizer;
  std::vector<std::map<std::string, at::Tensor>> compression;  // per saving rank, in rank order
  nlohmann::json meta;
};

// Writes checkpoints_dir/step_<step>/ atomically and returns its path.
std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step, const CheckpointContents& contents);

// A piece of a tensor in a shard: `values` (any shape, read flattened) are the elements of the
// whole tensor `name` that `region` (region.h) describes: a range of it flattened, or a
// tensor-parallel part (or a range of one).
struct TensorSlice {
  std::string name;
  at::Tensor values;
  Region region;
};

// Rank `rank`'s even slice, elements [r * ceil(n/N), (r + 1) * ceil(n/N)) clipped to n, of each
// whole tensor (a tensor with no elements there is left out).
std::vector<TensorSlice> even_slices(const NamedTensors& whole, int64_t rank, int64_t shards);

// The multi-rank protocol above. prepare_checkpoint_dir (rank 0) creates an empty
// step_<step>.partial/ and returns its path (partial_checkpoint_dir gives it on every rank);
// write_optimizer_shard writes rank `rank`'s slices (over all N ranks every element of every
// tensor must be written exactly once; load_checkpoint checks the coverage); commit_checkpoint
// (rank 0) writes the model (or, with contents.model_shards, the index of the shards every rank
// wrote with write_model_shard), the extra files and meta.json (recording `shards` = N) and
// renames the directory into place. `contents.optimizer` is ignored by commit_checkpoint. One
// process may write the model in shards too (`tessera import`, part by part): prepare_checkpoint_dir,
// write_model_shard for each, then commit_checkpoint with contents.model_shards and `shards` = 0,
// which writes contents.optimizer as one optimizer.safetensors.
std::string partial_checkpoint_dir(const std::string& checkpoints_dir, int64_t step);
std::string prepare_checkpoint_dir(const std::string& checkpoints_dir, int64_t step);
// Removes a failed save's partial directory (rank 0) while other ranks may still write into it.
// remove_all alone would race them (a file created between its listing and its rmdir keeps the
// directory), so the directory is first renamed to step_<N>.failed.partial, atomically: a rank's
// next file under step_<N>.partial/ then fails to open, and what is already open goes with the
// renamed directory (remove_interrupted_saves removes it where the lead dies in between).
// Returns "" when the directory is gone, else why not.
std::string remove_partial_checkpoint_dir(const std::string& partial);
void write_optimizer_shard(const std::string& partial_dir, int64_t rank, int64_t shards,
                           const std::vector<TensorSlice>& slices);
void write_compression_state(const std::string& partial_dir, int64_t rank, int64_t ranks, const NamedTensors& state);
// Rank `rank`'s model tensors and parts of tensors (export names; a part in its part's shape),
// model-<rank+1 as 00001>-of-<N>.safetensors: over all N ranks each tensor is written whole by
// exactly one, or in parts that tile it (commit_checkpoint refuses a tensor written twice whole,
// load_checkpoint parts that overlap or leave a gap).
void write_model_shard(const std::string& partial_dir, int64_t rank, int64_t shards,
                       const std::vector<TensorSlice>& tensors);
std::string commit_checkpoint(const std::string& checkpoints_dir, int64_t step, const CheckpointContents& contents,
                              int64_t shards);

// The part of one optimizer tensor a rank reads on resume, a region of the whole tensor, whose shape
// must be the region's (an empty region: none of it, only the shape is checked).
using OptimizerRange = Region;
using OptimizerRanges = std::map<std::string, Region>;

// What the state tensors of a checkpoint hold, declared by the components of the reading run:
// `training` for the optimizer files' tensors (optimizer slots, loss scaler, random streams,
// routing state), `compression` for the compression files'. Unset: StateKind::unknown (a reader
// that runs none of them, as `tessera export`).
struct StateKinds {
  StateKindOf training;
  StateKindOf compression;
};

// `path` may be a step directory, a checkpoints directory or a run directory (the latter two
// resolve through `latest`). Throws tessera::Error naming the file on any inconsistency. Every
// file is verified; the optimizer tensors are read only when `with_optimizer` (generation needs
// the model alone), the model's only when `with_model` (a resuming rank reads the tensors it
// keeps one at a time with read_model_tensor). A tensor named in `ranges` comes back as the 1-D tensor of its range (read
// shard by shard, so the whole tensor is never held); the others whole. The shards must cover
// each whole tensor, and each range, exactly once. Each state tensor is checked by its kind in
// `kinds`.
LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer = true,
                                 const OptimizerRanges& ranges = {}, bool with_model = true,
                                 const StateKinds& kinds = {});

// One model tensor of a checkpoint loaded without its model, read from its file alone (the files
// were verified by load_checkpoint).
at::Tensor read_model_tensor(const LoadedCheckpoint& ckpt, const std::string& name);
// The values of `region` of one model tensor (flattened), read from the pieces that hold them one
// at a time: a rank reading its tensor-parallel part never holds the whole tensor when the
// checkpoint was saved in parts. `region.shape` must be the stored tensor's.
at::Tensor read_model_region(const LoadedCheckpoint& ckpt, const std::string& name, const Region& region);
// A model tensor's whole shape as stored.
std::vector<int64_t> model_tensor_shape(const LoadedCheckpoint& ckpt, const std::string& name);

// A model to load (export names), as ParallelModel::load_model_state reads it: the tensors it
// holds, each one's whole shape, and the values of a region of one (flattened).
struct ModelReader {
  std::set<std::string> names;
  std::function<std::vector<int64_t>(const std::string& name)> shape;
  std::function<at::Tensor(const std::string& name, const Region& region)> read;
  std::string source;  // for messages
};
// A checkpoint's model (loaded without it: the tensors are read as asked for; `ckpt` outlives the reader).
ModelReader model_reader(const LoadedCheckpoint& ckpt);
// Whole tensors in memory (`tensors` outlives the reader).
ModelReader model_reader(const std::map<std::string, at::Tensor>& tensors, std::string source);

// Where a loaded checkpoint's model came from, for messages: ".../model.safetensors" or
// ".../model-*.safetensors" (sharded).
std::string model_source(const LoadedCheckpoint& ckpt);

// Resolves `path` as load_checkpoint does, without reading tensors.
std::string resolve_checkpoint_dir(const std::string& path);

// The step of the latest complete checkpoint under `checkpoints_dir` (its `latest` names
// step_<N>, whose meta.json exists), or -1 when there is none.
int64_t latest_checkpoint_step(const std::string& checkpoints_dir);

// Deletes the oldest complete step directories so that at most `keep` remain (keep <= 0: all).
void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep);

// What a save that did not finish left behind: every step_<N>.partial/ (a process killed while
// writing, a disk that filled up) and every step_<N>.replaced/ whose step_<N>/ is complete (a
// commit killed after the new directory went into place). Removes them and returns their names,
// for the run to say what it cleaned up; complete checkpoints are never touched. A missing
// `checkpoints_dir` has nothing to remove.
std::vector<std::string> remove_interrupted_saves(const std::string& checkpoints_dir);

}  // namespace tessera
