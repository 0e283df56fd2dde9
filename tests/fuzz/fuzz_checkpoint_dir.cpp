// libFuzzer target: a checkpoint directory's meta.json and model.safetensors.index.json
// (checkpoint/checkpoint.h, load_checkpoint), over fixed tensor files: a single-file model and
// optimizer, and a two-rank model saved in tensor-parallel parts (region records, part_map) with
// two optimizer shards. The input is the meta.json text, then after a line "---" the index text.
// A meta.json that parses as an object is re-signed first (each listed file's bytes and checksum,
// then meta_checksum), as a hand edit that knows the format would leave it, so the fuzzer reaches
// the fields behind the checksums. The first byte chooses ranges for the optimizer read. Every
// input must load or end in tessera::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "fuzz_files.h"
#include "core/fs.h"

namespace {

namespace fs = std::filesystem;

// The fixed files, written once.
std::string make_dir() {
  const std::string dir = "/tmp/tessera-fuzz-checkpoint-" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  using tessera::Region;
  const at::Tensor w = at::arange(8, at::kFloat).view({2, 4}), b = at::ones({3});
  tessera::write_safetensors(dir + "/model.safetensors", {{"w", w}, {"b", b}});
  tessera::write_safetensors(dir + "/optimizer.safetensors", {{"optim.w.exp_avg", w}, {"optim.w.step", at::full({}, 2.0)}});
  for (int64_t r = 0; r < 2; ++r) {
    const Region part = Region::split({2, 4}, 1, 1, r, 2);
    std::vector<tessera::TensorSlice> model{{"w", w.narrow(1, 2 * r, 2).contiguous(), part}};
    if (r == 0) model.push_back({"b", b, Region::whole({3})});
    tessera::write_model_shard(dir, r, 2, model);
    tessera::write_optimizer_shard(dir, r, 2, {{"optim.w.exp_avg", w.narrow(1, 2 * r, 2).contiguous(), part}});
  }
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string dir = make_dir();
  const uint8_t choice = data[0];
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t split = input.find("\n---\n");
  const std::string meta_text = input.substr(0, split);
  tessera::fuzz::write_file(dir + "/model.safetensors.index.json", split == std::string::npos ? "" : input.substr(split + 5));
  nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_object()) {
    if (meta.contains("files") && meta["files"].is_object())
      for (auto& [name, entry] : meta["files"].items()) {
        const fs::path file = fs::path(dir) / name;
        if (!entry.is_object() || name.empty() || name.find('/') != std::string::npos || name == "meta.json" ||
            !fs::is_regular_file(file))
          continue;
        entry["bytes"] = fs::file_size(file);
        entry["checksum"] = tessera::file_checksum(file.string());
      }
    nlohmann::json unsigned_meta = meta;
    unsigned_meta.erase("meta_checksum");
    meta["meta_checksum"] = tessera::checksum(unsigned_meta.dump());
    tessera::fuzz::write_file(dir + "/meta.json", meta.dump());
  } else {
    tessera::fuzz::write_file(dir + "/meta.json", meta_text);
  }
  tessera::OptimizerRanges ranges;
  if (choice & 1) ranges["optim.w.exp_avg"] = tessera::Region::split({2, 4}, 1, 1, (choice >> 1) & 1, 2).sub(0, 1 + (choice >> 2) % 4);
  try {
    const tessera::LoadedCheckpoint loaded = tessera::load_checkpoint(dir, true, ranges);
    for (const auto& [name, pieces] : loaded.model_files) tessera::read_model_tensor(loaded, name);
  } catch (const tessera::Error&) {
  }
  return 0;
}
