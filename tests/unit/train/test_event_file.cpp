// The TensorBoard event file's pieces that its reader cannot name when they break: the CRC-32C of
// the record framing (against the standard check value) and which numbers of a metrics line become
// which tags. The file as a whole is read back by TensorBoard itself (tests/tensorboard/).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "tensorboard/event_file.h"

namespace tessera {
namespace {

TEST(EventFile, Crc32cIsCastagnolisAndMaskedAsTensorBoardMasksIt) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, std::strlen(check)), 0xe3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t crc = crc32c(check, std::strlen(check));
  EXPECT_EQ(masked_crc32c(check, std::strlen(check)), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(EventFile, EveryNumberOfAMetricsLineBecomesATag) {
  const auto line = nlohmann::json::parse(R"({"step": 7, "loss": 2.5, "skipped": true, "name": "x",
      "swarm": {"members": 3, "peer": "a"},
      "moe": [{"layer": 1, "dropped": 0.25, "load": [0.5, 0.5]}]})");
  const auto scalars = scalars_of(line);
  const std::vector<std::pair<std::string, double>> expected = {
      {"loss", 2.5}, {"moe/layer1/dropped", 0.25}, {"moe/layer1/load/0", 0.5}, {"moe/layer1/load/1", 0.5},
      {"skipped", 1.0}, {"swarm/members", 3.0}};
  EXPECT_EQ(scalars, expected);
}

TEST(EventFile, RecordsAreFramedByLengthAndMaskedChecksums) {
  const std::string dir = test::fresh_dir("event_file");
  {
    EventFileWriter writer(dir);
    writer.write({{"step", 3}, {"loss", 1.5}}, 1.0);
    writer.write({{"step", 4}, {"name", "no scalar"}}, 2.0);  // no scalar: no record
  }
  std::ifstream in(dir + "/" + EventFileWriter::kFileName, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = 0, records = 0;
  while (offset < bytes.size()) {
    ASSERT_LE(offset + 12, bytes.size());
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + offset, 8);
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length_crc, bytes.data() + offset + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + offset, 8));
    ASSERT_LE(offset + 12 + length + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + offset + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(bytes.data() + offset + 12, length));
    offset += 12 + length + 4;
    ++records;
  }
  EXPECT_EQ(offset, bytes.size());
  EXPECT_EQ(records, 2u);  // the version record and step 3's
  const std::string version = "brain.Event:2";
  EXPECT_NE(bytes.find(version), std::string::npos);
}

}  // namespace
}  // namespace tessera
