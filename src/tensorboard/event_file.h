// TensorBoard event files: the scalars of metrics.jsonl, as TensorBoard reads them
// (`tensorboard --logdir runs/`; docs/training.md).
//
// This folder is compiled without libtorch's include directories (src/CMakeLists.txt): the torch
// wheel ships protobuf 3.13's headers, which would shadow Debian's 3.21 that protoc generates for.
// So nothing here includes a torch header, and the generated event.pb.h is included only by
// event_file.cpp.
//
// One file per run directory, RUN_DIR/events.out.tfevents.tessera: a fixed name (TensorBoard reads
// any file whose name holds "tfevents"), so that it is one of the run's files that --overwrite
// deletes (run_dir.cpp). The framing is TensorBoard's record format: each record is its length
// (uint64, little-endian), the masked CRC-32C of those 8 bytes, the serialized Event
// (event.proto, protobuf-lite) and the masked CRC-32C of the Event's bytes. The first record
// carries the version string "brain.Event:2"; every later one the scalars of one metrics line at
// its "step".
//
// What becomes a scalar (scalars_of): every number or boolean of a metrics line except "step",
// under its key; inside an object, "KEY/SUB"; inside an array, "KEY/I", or "KEY/layerL" for an
// object carrying a "layer" number (the MoE statistics: "moe/layer1/load/3"). Strings and nulls are
// not scalars. Values are written as TensorBoard's float32 simple values.
//
// Invariant: the file holds the scalars of exactly the lines written to it since it was opened,
// in order, each flushed as written. Its owner (MetricsLog) opens it anew with the lines a resumed
// run keeps, so a resumed run continues the same curves with no doubled or stale points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {

class EventFileWriter {
 public:
  static constexpr const char* kFileName = "events.out.tfevents.tessera";

  // Truncates (or creates) RUN_DIR/kFileName and writes the version record; throws naming the file.
  explicit EventFileWriter(const std::string& run_dir);
  // The scalars of `line` at its "step" (0 without one), stamped `wall_time` (Unix seconds).
  void write(const nlohmann::json& line, double wall_time);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);

  std::string path_;
  std::ofstream out_;
};

// The (tag, value) pairs of a metrics line, in the line's key order (above).
std::vector<std::pair<std::string, double>> scalars_of(const nlohmann::json& line);

// CRC-32C (Castagnoli), and TensorBoard's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace tessera
