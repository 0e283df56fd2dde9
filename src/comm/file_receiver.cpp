// The receiving side of a file transfer (file_receiver.h).
#include "comm/file_receiver.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera::comm {

std::vector<std::string> receive_files_from(const MessageSource& recv, const std::string& dir,
                                            const std::string& sender) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  at::Tensor count = at::empty({1}, at::kLong);
  recv(count, kFileCountTag);
  const int64_t files = count.item<int64_t>();
  require(files >= 0, sender, " announced ", files, " files");
  std::vector<std::string> names;
  for (int64_t i = 0; i < files; ++i) {
    at::Tensor header = at::empty({2}, at::kLong);
    recv(header, kFileHeaderTag);
    const int64_t name_size = header[0].item<int64_t>(), size = header[1].item<int64_t>();
    require(name_size > 0 && name_size < 4096 && size >= 0, "a file from ", sender, " has a malformed header");
    at::Tensor name_bytes = at::empty({name_size}, at::kByte);
    recv(name_bytes, kFileHeaderTag);
    const std::string name(static_cast<const char*>(name_bytes.data_ptr()), static_cast<size_t>(name_size));
    require(name.find('/') == std::string::npos && name.find('\0') == std::string::npos && name != "." && name != "..",
            sender, " sent a file named '", name, "', which is not a plain file name");
    const std::string path = (fs::path(dir) / name).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    require(fd >= 0, path, ": cannot create (", std::strerror(errno), ")");
    try {
      for (int64_t received = 0; received < size;) {
        const int64_t n = std::min(kTransferChunk, size - received);
        at::Tensor chunk = at::empty({n}, at::kByte);
        recv(chunk, kFileBytesTag);
        for (int64_t written = 0; written < n;) {
          const ssize_t w = ::write(fd, static_cast<const char*>(chunk.data_ptr()) + written, n - written);
          if (w < 0 && errno == EINTR) continue;
          require(w > 0, path, ": write failed (", std::strerror(errno), ")");
          written += w;
        }
        received += n;
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    require(synced, path, ": fsync failed");
    names.push_back(name);
  }
  return names;
}

}  // namespace tessera::comm
