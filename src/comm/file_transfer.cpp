// File transfer between ranks (file_transfer.h).
#include "comm/file_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "core/error.h"

namespace tessera::comm {
namespace {

namespace fs = std::filesystem;

// The file transfer's tags, apart from any other point-to-point traffic of the group.
constexpr int64_t kCountTag = 7101, kHeaderTag = 7102, kBytesTag = 7103;

at::Tensor bytes_tensor(int64_t n) { return at::empty({n}, at::kByte); }

}  // namespace

void send_files(Group& group, const std::string& dir, int64_t to) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  group.send(at::full({1}, static_cast<int64_t>(files.size()), at::kLong), to, kCountTag);
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const int64_t size = static_cast<int64_t>(fs::file_size(file));
    group.send(torch::tensor({static_cast<int64_t>(name.size()), size}, at::kLong), to, kHeaderTag);
    at::Tensor name_bytes = bytes_tensor(static_cast<int64_t>(name.size()));
    std::memcpy(name_bytes.data_ptr(), name.data(), name.size());
    group.send(name_bytes, to, kHeaderTag);
    std::ifstream in(file, std::ios::binary);
    require(in.good(), file.string(), ": cannot open to send to rank ", group.global_rank_of(to));
    for (int64_t sent = 0; sent < size;) {
      const int64_t n = std::min(kTransferChunk, size - sent);
      at::Tensor chunk = bytes_tensor(n);
      in.read(static_cast<char*>(chunk.data_ptr()), n);
      require(in.gcount() == n, file.string(), ": shorter than its size while sending it");
      group.send(chunk, to, kBytesTag);
      sent += n;
    }
  }
}

std::vector<std::string> receive_files(Group& group, const std::string& dir, int64_t from) {
  fs::create_directories(dir);
  at::Tensor count = at::empty({1}, at::kLong);
  group.recv(count, from, kCountTag);
  std::vector<std::string> names;
  for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
    at::Tensor header = at::empty({2}, at::kLong);
    group.recv(header, from, kHeaderTag);
    const int64_t name_size = header[0].item<int64_t>(), size = header[1].item<int64_t>();
    require(name_size > 0 && name_size < 4096 && size >= 0, "a file from rank ", group.global_rank_of(from),
            " has a malformed header");
    at::Tensor name_bytes = bytes_tensor(name_size);
    group.recv(name_bytes, from, kHeaderTag);
    const std::string name(static_cast<const char*>(name_bytes.data_ptr()), name_size);
    require(name.find('/') == std::string::npos && name != "." && name != "..", "rank ",
            group.global_rank_of(from), " sent a file named '", name, "', which is not a plain file name");
    const std::string path = (fs::path(dir) / name).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    require(fd >= 0, path, ": cannot create (", std::strerror(errno), ")");
    for (int64_t received = 0; received < size;) {
      const int64_t n = std::min(kTransferChunk, size - received);
      at::Tensor chunk = bytes_tensor(n);
      group.recv(chunk, from, kBytesTag);
      for (int64_t written = 0; written < n;) {
        const ssize_t w = ::write(fd, static_cast<const char*>(chunk.data_ptr()) + written, n - written);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          ::close(fd);
          fail(path, ": write failed (", std::strerror(errno), ")");
        }
        written += w;
      }
      received += n;
    }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    require(synced, path, ": fsync failed");
    names.push_back(name);
  }
  return names;
}

}  // namespace tessera::comm
