// safetensors reading and writing (https://github.com/huggingface/safetensors, "Format"):
//
//   [u64 little-endian N][N bytes of JSON header, space-padded to a multiple of 8][tensor bytes]
//   header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}}
//
// Offsets are relative to the start of the tensor bytes, contiguous, in the writer's order
// (by dtype size, largest first, then by name, as the reference writer does). Every way of reading
// (the whole file, one tensor, the sizes) runs the same checks on the whole header first: the
// header length within the file, every offset, shape and dtype against the file, the tensors'
// bytes contiguous with no overlap, gap or trailing bytes, and every metadata value a string; a
// failure names the file and the tensor, so a truncated or edited file is an error, never a wrong
// tensor, whichever command reads it.
#pragma once

#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;  // CPU tensors owning their memory
  std::map<std::string, std::string> metadata;
};

// Writes `tensors` (any device; copied to CPU, made contiguous) to `path`, replacing it. The file
// is fsync'ed before returning.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

SafetensorsContents read_safetensors(const std::string& path);
// The same from a stream (`path` names it in errors): what the fuzz target (tests/fuzz/) drives.
SafetensorsContents read_safetensors(std::istream& in, const std::string& path);

// The header alone (the data is not read), checked as every read checks it.
struct SafetensorsEntry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
};
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader read_safetensors_header(const std::string& path);

// One tensor of a file, read by seeking to its bytes (the rest of the file is not read). Throws
// tessera::Error naming the file and the tensor when it is absent or its entry is inconsistent.
at::Tensor read_safetensors_tensor(const std::string& path, const std::string& name);

}  // namespace tessera
