#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace tessera {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType type, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  fail(path, ": tensor '", tensor, "' has dtype ", at::toString(type), ", which safetensors cannot hold");
}

at::ScalarType dtype_from_name(const std::string& name, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  fail(path, ": tensor '", tensor, "' has unknown dtype '", name, "'");
}

// The byte size of a tensor of `shape`, refused (naming the tensor) when a dimension is negative or
// the size overflows or exceeds `available` bytes: a hostile header must not reach at::empty.
uint64_t checked_bytes(const std::vector<int64_t>& shape, at::ScalarType type, uint64_t available,
                       const std::string& path, const std::string& name) {
  for (int64_t d : shape)
    if (d < 0) fail(path, ": tensor '", name, "' has a negative dimension");
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t bytes = at::elementSize(type);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) || bytes > available)
      fail(path, ": tensor '", name, "' has shape ", at::IntArrayRef(shape), ", more bytes than the file holds");
  return bytes;
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, at::Tensor>> order;
  for (const auto& [name, t] : tensors) order.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second.element_size() != b.second.element_size()) return a.second.element_size() > b.second.element_size();
    return a.first < b.first;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : order) {
    if (header.contains(name)) fail(path, ": tensor name '", name, "' appears twice");
    size_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type(), path, name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string head;
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  head += json;
  // Written piece by piece: the tensors' bytes are never copied into one buffer.
  std::vector<std::pair<const char*, size_t>> pieces{{head.data(), head.size()}};
  for (const auto& [name, t] : order)
    pieces.emplace_back(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel() * t.element_size()));
  write_file_durable(path, pieces);
}

SafetensorsContents read_safetensors(const std::string& path) {
  std::string bytes = read_file(path);
  if (bytes.size() < 8) fail(path, ": truncated safetensors file (", bytes.size(), " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) fail(path, ": header length ", n, " exceeds the file size ", bytes.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed safetensors header (", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");

  const size_t data_start = 8 + n;
  const size_t data_size = bytes.size() - data_start;
  SafetensorsContents result;
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path, ": metadata value '", k, "' is not a string");
        result.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      auto type = dtype_from_name(entry.at("dtype").get<std::string>(), path, name);
      auto shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<size_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        fail(path, ": tensor '", name, "' lies outside the file (truncated?)");
      const size_t expected = checked_bytes(shape, type, data_size, path, name);
      if (offsets[1] - offsets[0] != expected)
        fail(path, ": tensor '", name, "' has ", offsets[1] - offsets[0], " bytes, its shape needs ", expected);
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
      if (expected) std::memcpy(t.data_ptr(), bytes.data() + data_start + offsets[0], expected);
      result.tensors.emplace(name, std::move(t));
      spans.emplace_back(offsets[0], offsets[1]);
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": malformed entry for tensor '", name, "' (", e.what(), ")");
    }
  }
  std::sort(spans.begin(), spans.end());
  size_t cursor = 0;
  for (const auto& [begin, end] : spans) {
    if (begin != cursor) fail(path, ": tensor data is not contiguous at byte ", begin, " (overlap or gap)");
    cursor = end;
  }
  if (cursor != data_size) fail(path, ": ", data_size - cursor, " trailing bytes after the last tensor");
  return result;
}

namespace {

// The parsed header of an open file and where the tensor bytes start.
nlohmann::json read_header(std::ifstream& in, const std::string& path, uint64_t& data_start) {
  if (!in) fail(path, ": cannot open");
  unsigned char length[8];
  if (!in.read(reinterpret_cast<char*>(length), 8)) fail(path, ": truncated safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  std::string text(n, ' ');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) fail(path, ": header length ", n, " exceeds the file");
  data_start = 8 + n;
  try {
    nlohmann::json header = nlohmann::json::parse(text);
    if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");
    return header;
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed safetensors header (", e.what(), ")");
  }
}

}  // namespace

at::Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  uint64_t data_start = 0;
  const nlohmann::json header = read_header(in, path, data_start);
  if (!header.contains(name) || name == "__metadata__") fail(path, ": no tensor '", name, "'");
  try {
    const auto& entry = header.at(name);
    const auto type = dtype_from_name(entry.at("dtype").get<std::string>(), path, name);
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    in.seekg(0, std::ios::end);
    const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
    const uint64_t bytes = checked_bytes(shape, type, file_bytes > data_start ? file_bytes - data_start : 0, path, name);
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] - offsets[0] != bytes)
      fail(path, ": tensor '", name, "' has inconsistent offsets for its shape");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
    if (bytes && !in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes)))
      fail(path, ": tensor '", name, "' lies outside the file (truncated?)");
    return t;
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed entry for tensor '", name, "' (", e.what(), ")");
  }
}

std::map<std::string, int64_t> read_safetensors_sizes(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  uint64_t data_start = 0;
  const nlohmann::json header = read_header(in, path, data_start);
  std::map<std::string, int64_t> sizes;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2) fail(path, ": malformed entry for tensor '", name, "'");
      sizes[name] = offsets[1] - offsets[0];
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed safetensors header (", e.what(), ")");
  }
  return sizes;
}

}  // namespace tessera
