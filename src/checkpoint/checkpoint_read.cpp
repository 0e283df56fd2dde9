// Reading checkpoints (checkpoint.h): resolving a path, the model's tensors whole or by region
// from one file or Hugging Face-style shards, the optimizer's from one file or every rank's
// shards, each checked before it is used. Writing is in checkpoint.cpp.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include "checkpoint/checkpoint_files.h"
#include "core/error.h"
#include "core/flat_tensors.h"
#include "core/fs.h"
#include "core/json_file.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

// The checks of a tensor of kind `kind` (core/state_kind.h) read from a checkpoint: a wrong dtype,
// a NaN or a negative second moment would resume into NaN.
void check_state_tensor(const std::string& file, const std::string& name, const at::Tensor& t, StateKind kind) {
  if (kind == StateKind::bytes) return;
  const bool integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
  if (integral && kind == StateKind::counter) {
    require(t.numel() == 0 || t.min().item<int64_t>() >= 0, file, ": counter '", name, "' is negative");
    return;
  }
  if (integral && kind == StateKind::unknown) return;
  require(at::isFloatingType(t.scalar_type()), file, ": tensor '", name, "' has dtype ", t.scalar_type(),
          "; a checkpoint's model and optimizer tensors are floating point (counters may be integers)");
  require(all_finite(t), file, ": tensor '", name,
          "' holds NaN or infinite values; a run resumed from it would train on garbage");
  if (kind == StateKind::non_negative)
    require(t.numel() == 0 || t.min().item<double>() >= 0, file, ": tensor '", name,
            "' is a second moment with negative entries (", t.min().item<double>(), ")");
}

StateKind kind_by(const StateKindOf& kind_of, const std::string& name) {
  return kind_of ? kind_of(name) : StateKind::unknown;
}

// The pieces of each model tensor of a checkpoint: the one file, or for `shards` files the files
// the index names, checked against the shards' headers (every tensor in exactly the files named,
// its parts tiling it).
std::map<std::string, std::vector<StoredPiece>> model_file_map(const fs::path& dir, int64_t shards) {
  std::map<std::string, std::vector<StoredPiece>> pieces;
  if (shards == 0) {
    const std::string file = (dir / checkpoint_files::kModelFile).string();
    for (const auto& [name, e] : read_safetensors_header(file).tensors) pieces[name] = {{file, Region::whole(e.shape)}};
    return pieces;
  }
  const std::string index_path = (dir / checkpoint_files::kModelIndex).string();
  const nlohmann::json index = read_json_file(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) fail(index_path, ": no weight_map");
  const nlohmann::json parts = index.value("part_map", nlohmann::json::object());
  if (!parts.is_object()) fail(index_path, ": part_map is not an object");
  auto listed = [&](const std::string& name, const std::string& file) {
    if (!parts.contains(name)) return index["weight_map"].value(name, std::string()) == file;
    const nlohmann::json& files = parts[name];
    return files.is_array() && std::find(files.begin(), files.end(), file) != files.end();
  };
  for (int64_t r = 0; r < shards; ++r) {
    const std::string file = checkpoint_files::model_shard_name(r, shards), path = (dir / file).string();
    const SafetensorsHeader header = read_safetensors_header(path);
    for (const auto& [name, e] : header.tensors) {
      if (!listed(name, file)) fail(path, ": holds '", name, "', which ", index_path, " does not place in this file");
      const auto record = header.metadata.find(name);
      const int64_t numel = Region::whole(e.shape).whole_numel();
      pieces[name].push_back({path, record == header.metadata.end()
                                        ? Region::whole(e.shape)
                                        : Region::parse(record->second, numel, path + ": '" + name + "'")});
    }
  }
  for (const auto& [name, file] : index["weight_map"].items())
    if (!pieces.count(name) || pieces[name].size() != 1 ||
        !pieces[name][0].region.is_whole())
      fail(index_path, ": names '", name, "' in ", file.dump(), ", which lacks it or holds a part of it");
  for (const auto& [name, files] : parts.items()) {
    if (!pieces.count(name) || !files.is_array() || pieces[name].size() != files.size())
      fail(index_path, ": places the parts of '", name, "' in ", files.dump(), ", the shards hold ",
           pieces.count(name) ? pieces[name].size() : 0);
    std::vector<Region> regions;
    for (const StoredPiece& p : pieces[name]) regions.push_back(p.region);
    if (!tiles(regions)) fail(index_path, ": the parts of '", name, "' overlap or leave a gap");
  }
  return pieces;
}

// Collects the optimizer tensors of a checkpoint from their pieces (a shard's regions, or the whole
// tensors of a single-file checkpoint): whole tensors, or for names in `ranges` that region's
// values, 1-D.
class OptimizerAssembly {
 public:
  OptimizerAssembly(const OptimizerRanges& ranges, const StateKindOf& kind_of) : ranges_(ranges), kind_of_(kind_of) {}

  // `values` hold `stored` of the tensor `name`.
  void add(const std::string& file, const std::string& name, const at::Tensor& values, const Region& stored) {
    check_state_tensor(file, name, values, kind_by(kind_of_, name));
    auto it = parts_.find(name);
    if (it == parts_.end()) {
      auto range = ranges_.find(name);
      Part part{range != ranges_.end() ? range->second : Region::whole(stored.shape), {}, 0};
      require(part.want.shape == stored.shape, file, ": optimizer tensor '", name, "' has shape ",
              at::IntArrayRef(stored.shape), ", this run expects ", at::IntArrayRef(part.want.shape));
      part.values = range != ranges_.end() ? at::empty({part.want.numel()}, values.options())
                                           : at::empty(stored.shape, values.options());
      it = parts_.emplace(name, std::move(part)).first;
    }
    Part& part = it->second;
    require(part.want.shape == stored.shape, file, ": slice of '", name, "' records shape ",
            at::IntArrayRef(stored.shape), ", another shard ", at::IntArrayRef(part.want.shape));
    part.covered += copy_overlap(stored, values, part.want, part.values);
  }

  std::map<std::string, at::Tensor> finish(const std::string& where) {
    std::map<std::string, at::Tensor> out;
    for (auto& [name, part] : parts_) {
      require(part.covered == part.want.numel(), where, ": the shards cover ", part.covered, " of the ",
              part.want.numel(), " elements of '", name, "'", ranges_.count(name) ? " this rank reads" : "");
      out.emplace(name, std::move(part.values));
    }
    return out;
  }

 private:
  struct Part {
    Region want;
    at::Tensor values;
    int64_t covered;
  };
  const OptimizerRanges& ranges_;
  const StateKindOf& kind_of_;
  std::map<std::string, Part> parts_;
};

// The shards of a multi-rank checkpoint, read one file at a time. Each shard tensor is 1-D; the
// file's metadata holds its region's record (region.h).
std::map<std::string, at::Tensor> assemble_shards(const fs::path& dir, int64_t shards, const OptimizerRanges& ranges,
                                                  const StateKindOf& kind_of) {
  OptimizerAssembly assembly(ranges, kind_of);
  for (int64_t r = 0; r < shards; ++r) {
    const std::string path = (dir / checkpoint_files::shard_name(r, shards)).string();
    SafetensorsContents shard = read_safetensors(path);
    for (const auto& [name, slice] : shard.tensors) {
      auto meta = shard.metadata.find(name);
      require(meta != shard.metadata.end(), path, ": tensor '", name, "' has no slice record in the metadata");
      assembly.add(path, name, slice, Region::parse(meta->second, slice.numel(), path + ": '" + name + "'"));
    }
  }
  return assembly.finish(dir.string());
}

std::map<std::string, at::Tensor> read_optimizer_file(const fs::path& file, const OptimizerRanges& ranges,
                                                      const StateKindOf& kind_of) {
  OptimizerAssembly assembly(ranges, kind_of);
  for (const auto& [name, t] : read_safetensors(file.string()).tensors)
    assembly.add(file.string(), name, t, Region::whole(t.sizes().vec()));
  return assembly.finish(file.string());
}

}  // namespace

std::string model_source(const LoadedCheckpoint& ckpt) {
  return ckpt.dir + (ckpt.meta.contains("model_shards") ? "/model-*.safetensors" : "/" + std::string(checkpoint_files::kModelFile));
}

std::string resolve_checkpoint_dir(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) fail(path, ": checkpoint path does not exist");
  if (fs::exists(p / checkpoint_files::kMetaFile)) return p.string();
  for (const fs::path& dir : {p, p / "checkpoints"}) {
    fs::path latest = dir / "latest";
    if (fs::exists(latest)) {
      std::string name = read_file(latest.string());
      name.erase(name.find_last_not_of(" \n\r\t") + 1);
      fs::path target = dir / name;
      if (!fs::exists(target / checkpoint_files::kMetaFile)) fail(latest.string(), ": names '", name, "', which is not a complete checkpoint");
      return target.string();
    }
  }
  fail(path, ": not a checkpoint (no meta.json) and no checkpoints/latest beneath it");
}

int64_t latest_checkpoint_step(const std::string& checkpoints_dir) {
  const fs::path latest = fs::path(checkpoints_dir) / "latest";
  if (!fs::exists(latest)) return -1;
  std::string name = read_file(latest.string());
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  for (const auto& [step, dir] : checkpoint_files::step_dirs(checkpoints_dir))
    if (dir.filename() == name && fs::exists(dir / checkpoint_files::kMetaFile)) return step;
  return -1;
}

namespace {

const std::vector<StoredPiece>& pieces_of(const LoadedCheckpoint& ckpt, const std::string& name) {
  const auto it = ckpt.model_files.find(name);
  if (it == ckpt.model_files.end()) fail(ckpt.dir, ": the checkpoint's model has no tensor '", name, "'");
  return it->second;
}

}  // namespace

std::vector<int64_t> model_tensor_shape(const LoadedCheckpoint& ckpt, const std::string& name) {
  return pieces_of(ckpt, name).front().region.shape;
}

at::Tensor read_model_region(const LoadedCheckpoint& ckpt, const std::string& name, const Region& region) {
  const std::vector<StoredPiece>& pieces = pieces_of(ckpt, name);
  require(region.shape == pieces.front().region.shape, model_source(ckpt), ": tensor '", name, "' has shape ",
          at::IntArrayRef(pieces.front().region.shape), ", read as ", at::IntArrayRef(region.shape));
  at::Tensor values;
  int64_t covered = 0;
  for (const StoredPiece& piece : pieces) {
    if (pieces.size() > 1 && !overlaps(piece.region, region)) continue;
    const at::Tensor t = read_safetensors_tensor(piece.file, name);
    check_state_tensor(piece.file, name, t, StateKind::real);
    if (!values.defined()) values = at::empty({region.numel()}, t.options());
    require(t.scalar_type() == values.scalar_type(), piece.file, ": part of '", name, "' has dtype ",
            t.scalar_type(), ", another part ", values.scalar_type());
    covered += copy_overlap(piece.region, t, region, values);
  }
  require(covered == region.numel(), model_source(ckpt), ": the parts of '", name, "' cover ", covered, " of the ",
          region.numel(), " elements read");
  return values.defined() ? values : at::empty({0});
}

ModelReader model_reader(const LoadedCheckpoint& ckpt) {
  ModelReader reader;
  for (const auto& [name, pieces] : ckpt.model_files) reader.names.insert(name);
  reader.shape = [&ckpt](const std::string& name) { return model_tensor_shape(ckpt, name); };
  reader.read = [&ckpt](const std::string& name, const Region& region) { return read_model_region(ckpt, name, region); };
  reader.source = model_source(ckpt);
  return reader;
}

ModelReader model_reader(const std::map<std::string, at::Tensor>& tensors, std::string source) {
  ModelReader reader;
  for (const auto& [name, t] : tensors) reader.names.insert(name);
  reader.shape = [&tensors](const std::string& name) { return tensors.at(name).sizes().vec(); };
  reader.read = [&tensors](const std::string& name, const Region& region) {
    const at::Tensor& t = tensors.at(name);
    at::Tensor values = at::empty({region.numel()}, t.options());
    copy_overlap(Region::whole(t.sizes().vec()), t, region, values);
    return values;
  };
  reader.source = std::move(source);
  return reader;
}

at::Tensor read_model_tensor(const LoadedCheckpoint& ckpt, const std::string& name) {
  const std::vector<int64_t> shape = model_tensor_shape(ckpt, name);
  return read_model_region(ckpt, name, Region::whole(shape)).view(shape);
}

LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer, const OptimizerRanges& ranges,
                                 bool with_model, const StateKinds& kinds) {
  LoadedCheckpoint out;
  out.dir = resolve_checkpoint_dir(path);
  const fs::path dir(out.dir);
  const std::string meta_path = (dir / checkpoint_files::kMetaFile).string();
  out.meta = read_json_file(meta_path);
  require(out.meta.is_object(), meta_path, ": not a JSON object");
  const int64_t version = meta_field<int64_t>(out.meta, "format_version", meta_path);
  if (version != kCheckpointFormatVersion)
    fail(meta_path, ": checkpoint format version ", version, ", this tessera reads version ", kCheckpointFormatVersion);
  if (meta_field<std::string>(out.meta, "meta_checksum", meta_path) != checkpoint_files::meta_checksum(out.meta))
    fail(meta_path, ": checksum mismatch (the file was modified or corrupted)");
  out.step = meta_field<int64_t>(out.meta, "step", meta_path);
  require(out.step >= 0, meta_path, ": step ", out.step, " is negative");
  const std::string dir_name = dir.filename().string();
  if (dir_name.rfind("step_", 0) == 0 && dir_name.size() > 5 &&
      std::all_of(dir_name.begin() + 5, dir_name.end(), ::isdigit))
    require(dir_name == checkpoint_files::step_name(out.step), meta_path, ": step ", out.step, " disagrees with the directory name ",
            dir_name);
  const nlohmann::json files = meta_field<nlohmann::json>(out.meta, "files", meta_path);
  auto count = [&](const char* key) {
    const int64_t n = out.meta.contains(key) ? meta_field<int64_t>(out.meta, key, meta_path) : 0;
    require(n >= 0 && n <= (1 << 20), meta_path, ": '", key, "' = ", n, " is out of range");
    return n;
  };
  const int64_t shards = count("optimizer_shards");
  const int64_t model_shards = count("model_shards");
  std::vector<std::string> required;
  if (model_shards == 0) required.push_back(checkpoint_files::kModelFile);
  else required.push_back(checkpoint_files::kModelIndex);
  for (int64_t r = 0; r < model_shards; ++r) required.push_back(checkpoint_files::model_shard_name(r, model_shards));
  for (int64_t r = 0; r < shards; ++r) required.push_back(checkpoint_files::shard_name(r, shards));
  if (shards == 0) required.push_back(checkpoint_files::kOptimizerFile);
  const int64_t compression_ranks = count("compression_ranks");
  for (int64_t r = 0; r < compression_ranks; ++r) required.push_back(checkpoint_files::compression_name(r, compression_ranks));
  for (const auto& name : required)
    if (!files.contains(name)) fail(meta_path, ": does not list ", name);
  for (const auto& [name, info] : files.items()) {
    require(name.find('/') == std::string::npos && name != ".." && info.is_object() && info.contains("bytes") &&
                info["bytes"].is_number_unsigned() && info.contains("checksum") && info["checksum"].is_string(),
            meta_path, ": the entry of '", name, "' in 'files' is malformed");
    const fs::path file = dir / name;
    require_regular_file(file.string());  // not a directory, a device, a symlink loop
    if (!fs::exists(file)) fail(file.string(), ": missing from the checkpoint");
    uintmax_t bytes = fs::file_size(file);
    if (bytes != info["bytes"].get<uintmax_t>())
      fail(file.string(), ": ", bytes, " bytes, meta.json records ", info["bytes"].get<uintmax_t>(), " (truncated?)");
    if (file_checksum(file.string()) != info["checksum"].get<std::string>())
      fail(file.string(), ": checksum mismatch (the file was modified or corrupted)");
  }
  out.model_files = model_file_map(dir, model_shards);
  if (with_model)
    for (const auto& [name, pieces] : out.model_files) out.model.emplace(name, read_model_tensor(out, name));
  if (!with_optimizer) return out;
  out.optimizer = shards > 0 ? assemble_shards(dir, shards, ranges, kinds.training)
                             : read_optimizer_file(dir / checkpoint_files::kOptimizerFile, ranges, kinds.training);
  for (int64_t r = 0; r < compression_ranks; ++r) {
    const std::string file = (dir / checkpoint_files::compression_name(r, compression_ranks)).string();
    out.compression.push_back(read_safetensors(file).tensors);
    for (const auto& [name, t] : out.compression.back())
      check_state_tensor(file, name, t, kind_by(kinds.compression, name));
  }
  return out;
}

}  // namespace tessera
