// File transfer between ranks (file_transfer.h).
#include "comm/file_transfer.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/types.h>

#include "core/error.h"

namespace tessera::comm {
namespace {

namespace fs = std::filesystem;

at::Tensor bytes_tensor(int64_t n) { return at::empty({n}, at::kByte); }

}  // namespace

void send_files(Group& group, const std::string& dir, int64_t to) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  group.send(at::full({1}, static_cast<int64_t>(files.size()), at::kLong), to, kFileCountTag);
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const int64_t size = static_cast<int64_t>(fs::file_size(file));
    group.send(torch::tensor({static_cast<int64_t>(name.size()), size}, at::kLong), to, kFileHeaderTag);
    at::Tensor name_bytes = bytes_tensor(static_cast<int64_t>(name.size()));
    std::memcpy(name_bytes.data_ptr(), name.data(), name.size());
    group.send(name_bytes, to, kFileHeaderTag);
    std::ifstream in(file, std::ios::binary);
    require(in.good(), file.string(), ": cannot open to send to rank ", group.global_rank_of(to));
    for (int64_t sent = 0; sent < size;) {
      const int64_t n = std::min(kTransferChunk, size - sent);
      at::Tensor chunk = bytes_tensor(n);
      in.read(static_cast<char*>(chunk.data_ptr()), n);
      require(in.gcount() == n, file.string(), ": shorter than its size while sending it");
      group.send(chunk, to, kFileBytesTag);
      sent += n;
    }
  }
}

std::vector<std::string> receive_files(Group& group, const std::string& dir, int64_t from) {
  return receive_files_from([&](at::Tensor& into, int64_t tag) { group.recv(into, from, tag); }, dir,
                            "rank " + std::to_string(group.global_rank_of(from)));
}

}  // namespace tessera::comm
