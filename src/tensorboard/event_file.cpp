// TensorBoard event files (event_file.h).
#include "tensorboard/event_file.h"

#include <array>

#include "core/error.h"
#include "tensorboard/event.pb.h"

namespace tessera {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
    table[i] = c;
  }
  return table;
}

void add_scalars(const std::string& tag, const nlohmann::json& value, std::vector<std::pair<std::string, double>>& out) {
  if (value.is_boolean()) {
    out.emplace_back(tag, value.get<bool>() ? 1.0 : 0.0);
  } else if (value.is_number()) {
    out.emplace_back(tag, value.get<double>());
  } else if (value.is_object()) {
    for (const auto& [key, inner] : value.items()) add_scalars(tag + "/" + key, inner, out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      const nlohmann::json& inner = value[i];
      if (!inner.is_object() || !inner.contains("layer") || !inner["layer"].is_number_integer()) {
        add_scalars(tag + "/" + std::to_string(i), inner, out);
        continue;
      }
      const std::string layer = tag + "/layer" + std::to_string(inner["layer"].get<int64_t>());
      for (const auto& [key, field] : inner.items())
        if (key != "layer") add_scalars(layer + "/" + key, field, out);
    }
  }
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::vector<std::pair<std::string, double>> scalars_of(const nlohmann::json& line) {
  std::vector<std::pair<std::string, double>> out;
  if (!line.is_object()) return out;
  for (const auto& [key, value] : line.items())
    if (key != "step") add_scalars(key, value, out);
  return out;
}

EventFileWriter::EventFileWriter(const std::string& run_dir) : path_(run_dir + "/" + kFileName) {
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) fail(path_, ": cannot open for writing (train.tensorboard = false turns TensorBoard's event file off)");
  tensorboard::Event version;
  version.set_wall_time(0);
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
}

void EventFileWriter::write(const nlohmann::json& line, double wall_time) {
  const auto scalars = scalars_of(line);
  if (scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(line.contains("step") && line["step"].is_number() ? line["step"].get<int64_t>() : 0);  // an object: it has scalars
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void EventFileWriter::write_record(const std::string& bytes) {
  std::string record;
  record.reserve(bytes.size() + 16);
  put_u64(record, bytes.size());
  put_u32(record, masked_crc32c(record.data(), 8));
  record += bytes;
  put_u32(record, masked_crc32c(bytes.data(), bytes.size()));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  if (!out_) fail(path_, ": write failed (disk full?)");
}

}  // namespace tessera
