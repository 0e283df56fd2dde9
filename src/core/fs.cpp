#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace tessera {

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // the caller says what is missing
    fail(path, ": cannot be read (", std::strerror(errno), ")");  // a symlink loop, a denied directory
  }
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                     : S_ISDIR(st.st_mode) ? "a directory"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                   : "a special file";
  fail(path, ": is ", kind, ", not a regular file; tessera reads data, configs and checkpoints from regular files only");
}

std::string read_file(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file_durable(const std::string& path, const std::string& bytes) {
  write_file_durable(path, {{bytes.data(), bytes.size()}});
}

void write_file_durable(const std::string& path, const std::vector<std::pair<const char*, size_t>>& pieces) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(path, ": cannot create (", std::strerror(errno), ")");
  for (const auto& [data, size] : pieces) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd, data + done, size - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd);
        fail(path, ": write failed (", std::strerror(e), ")");
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail(path, ": fsync/close failed (", std::strerror(errno), ")");
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(path, ": cannot open directory (", std::strerror(errno), ")");
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  write_file_durable(tmp, bytes);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, ": rename failed (", std::strerror(errno), ")");
  size_t slash = path.find_last_of('/');
  fsync_directory(slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash));
}

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

uint64_t fnv1a(uint64_t hash, const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string hex(uint64_t hash) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

}  // namespace

std::string file_checksum(const std::string& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open (", std::strerror(errno), ")");
  uint64_t hash = kFnvOffset;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash = fnv1a(hash, buffer.data(), static_cast<size_t>(in.gcount()));
  }
  return hex(hash);
}

std::string checksum(const std::string& bytes) { return hex(fnv1a(kFnvOffset, bytes.data(), bytes.size())); }

}  // namespace tessera
