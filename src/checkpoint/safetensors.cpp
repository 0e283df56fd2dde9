#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <type_traits>

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
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    // No bytes, but the strides still multiply the other dimensions (at::empty ends the process
    // with its own error when they overflow): they must fit int64.
    uint64_t strides = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(strides, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &strides) ||
          strides > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, ": tensor '", name, "' has shape ", at::IntArrayRef(shape), ", whose size overflows");
    return 0;
  }
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

namespace {

struct IndexEntry {
  at::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets into the tensor bytes
};

// The one reader's checks, shared by every way of reading a file: the header length within the
// file (checked before anything is allocated), a JSON object, every entry's dtype, shape and
// offsets consistent and inside the file, the tensors' bytes contiguous (no overlap, no gap, no
// trailing bytes) and every metadata value a string. Throws tessera::Error naming the file and
// the tensor or key.
struct Index {
  uint64_t data_start = 0;
  std::map<std::string, IndexEntry> entries;
  std::map<std::string, std::string> metadata;
};

// A JSON array of integers that fit T, refused naming the tensor and the field otherwise (a number
// past 2^64 parses as a float, whose conversion would be undefined).
template <typename T>
std::vector<T> integers(const nlohmann::json& array, const std::string& path, const std::string& name,
                        const char* field) {
  if (!array.is_array()) fail(path, ": tensor '", name, "' has a ", field, " that is not an array");
  std::vector<T> out;
  for (const auto& v : array) {
    const auto most = static_cast<uint64_t>(std::numeric_limits<T>::max());
    const bool fits = std::is_signed_v<T> ? v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= most)
                                          : v.is_number_unsigned();
    if (!fits) fail(path, ": tensor '", name, "' has ", field, " entry ", v.dump(), ", not an integer of its range");
    out.push_back(v.get<T>());
  }
  return out;
}

Index read_index(std::istream& in, const std::string& path) {
  if (!in) fail(path, ": cannot open (", std::strerror(errno), ")");
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  if (end < 0) fail(path, ": cannot read its size");
  const uint64_t file_bytes = static_cast<uint64_t>(end);
  in.seekg(0);
  unsigned char length[8];
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(length), 8))
    fail(path, ": truncated safetensors file (", file_bytes, " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > file_bytes - 8) fail(path, ": header length ", n, " exceeds the file size ", file_bytes);
  std::string text(n, ' ');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) fail(path, ": cannot read its header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed safetensors header (", e.what(), ")");
  }
  if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");
  Index index;
  index.data_start = 8 + n;
  const uint64_t data_size = file_bytes - index.data_start;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, ": __metadata__ is not a JSON object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path, ": metadata value '", k, "' is not a string");
        index.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      IndexEntry e;
      e.type = dtype_from_name(entry.at("dtype").get<std::string>(), path, name);
      e.shape = integers<int64_t>(entry.at("shape"), path, name, "shape");
      const auto offsets = integers<uint64_t>(entry.at("data_offsets"), path, name, "data_offsets");
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        fail(path, ": tensor '", name, "' lies outside the file (truncated?)");
      const uint64_t expected = checked_bytes(e.shape, e.type, data_size, path, name);
      if (offsets[1] - offsets[0] != expected)
        fail(path, ": tensor '", name, "' has ", offsets[1] - offsets[0], " bytes, its shape needs ", expected);
      e.begin = offsets[0];
      e.end = offsets[1];
      spans.emplace_back(e.begin, e.end);
      index.entries.emplace(name, std::move(e));
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": malformed entry for tensor '", name, "' (", e.what(), ")");
    }
  }
  std::sort(spans.begin(), spans.end());
  uint64_t cursor = 0;
  for (const auto& [begin, end] : spans) {
    if (begin != cursor) fail(path, ": tensor data is not contiguous at byte ", begin, " (overlap or gap)");
    cursor = end;
  }
  if (cursor != data_size) fail(path, ": ", data_size - cursor, " trailing bytes after the last tensor");
  return index;
}

std::ifstream open_checked(const std::string& path) {
  require_regular_file(path);
  return std::ifstream(path, std::ios::binary);
}

at::Tensor read_entry(std::istream& in, const Index& index, const std::string& path, const std::string& name) {
  const IndexEntry& e = index.entries.at(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));
  const uint64_t bytes = e.end - e.begin;
  in.seekg(static_cast<std::streamoff>(index.data_start + e.begin));
  if (bytes && !in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes)))
    fail(path, ": tensor '", name, "' cannot be read (the file changed while it was read?)");
  return t;
}

}  // namespace

SafetensorsContents read_safetensors(std::istream& in, const std::string& path) {
  const Index index = read_index(in, path);
  SafetensorsContents result;
  result.metadata = index.metadata;
  for (const auto& [name, entry] : index.entries) result.tensors.emplace(name, read_entry(in, index, path, name));
  return result;
}

SafetensorsContents read_safetensors(const std::string& path) {
  std::ifstream in = open_checked(path);
  return read_safetensors(in, path);
}

at::Tensor read_safetensors_tensor(const std::string& path, const std::string& name) {
  std::ifstream in = open_checked(path);
  const Index index = read_index(in, path);
  if (!index.entries.count(name)) fail(path, ": no tensor '", name, "'");
  return read_entry(in, index, path, name);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in = open_checked(path);
  const Index index = read_index(in, path);
  SafetensorsHeader header;
  header.metadata = index.metadata;
  for (const auto& [name, e] : index.entries)
    header.tensors[name] = {e.type, e.shape, static_cast<int64_t>(e.end - e.begin)};
  return header;
}

}  // namespace tessera
