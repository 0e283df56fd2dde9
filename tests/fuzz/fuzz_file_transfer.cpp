// libFuzzer target: the receiving side of a file transfer (comm/file_receiver.h), as a rank reads
// another rank's checkpoint files (checkpoint.gather). The input is the sender's messages back to
// back: each message takes as many bytes as the receiver asks for, and running out ends the
// transfer with tessera::Error, as a closed connection would. Whatever it accepts, every name it
// returns is a regular file directly inside the receiving directory, and nothing appears beside
// that directory.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/file_receiver.h"
#include "core/error.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // In memory (tmpfs) where there is one: the receiver fsyncs every file it writes.
  static const fs::path base = [] {
    const fs::path b = (fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path()) /
                       ("tessera_fuzz_transfer_" + std::to_string(::getpid()));
    fs::remove_all(b);
    fs::create_directories(b);
    return b;
  }();
  const fs::path dir = base / "incoming";
  size_t at = 0;
  const tessera::comm::MessageSource source = [&](at::Tensor& into, int64_t) {
    const size_t n = static_cast<size_t>(into.nbytes());
    if (size - at < n) tessera::fail("rank 1: the connection closed");
    std::memcpy(into.data_ptr(), data + at, n);
    at += n;
  };
  try {
    for (const std::string& name : tessera::comm::receive_files_from(source, dir.string(), "rank 1")) {
      const fs::path file = dir / name;
      if (file.parent_path() != dir || !fs::is_regular_file(file)) __builtin_trap();
    }
  } catch (const tessera::Error&) {
  }
  for (const auto& entry : fs::directory_iterator(base))
    if (entry.path() != dir) __builtin_trap();
  if (fs::exists(dir)) {
    std::vector<fs::path> received;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) __builtin_trap();
      received.push_back(entry.path());
    }
    for (const fs::path& file : received) fs::remove(file);  // the next input starts from an empty directory
  }
  return 0;
}
