// TokenFile: mmap'ed llm.c (uint16 or uint32) / raw uint16 token files, and the llm.c writer used by `tessera prepare`.
// The host is assumed little-endian (x86-64, AArch64), as llm.c and nanoGPT assume.
#include "data/token_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <ATen/ops/empty.h>

#include "core/error.h"
#include "core/fs.h"

namespace tessera {
namespace {

// The live mappings, for the SIGBUS handler: a slot is claimed by setting `bytes` last and freed by
// clearing it first, so the handler never sees a half-written slot as live.
struct MappingSlot {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> bytes{0};
  char path[512] = {};
};
constexpr size_t kMappingSlots = 4096;
MappingSlot g_mappings[kMappingSlots];
std::atomic<size_t> g_claimed{0};  // slots [0, g_claimed) have been used at least once
std::mutex g_slots_mutex;

void write_all(const char* text) {
  size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  const size_t used = g_claimed.load();
  for (size_t i = 0; i < used; ++i) {
    const size_t bytes = g_mappings[i].bytes.load();
    const uintptr_t base = g_mappings[i].base.load();
    if (bytes == 0 || address < base || address >= base + bytes) continue;
    write_all("error: ");
    write_all(g_mappings[i].path);
    write_all(": the memory-mapped token file shrank or became unreadable while the run read it (SIGBUS): "
              "was it truncated or rewritten in place? Token files must not change during a run; the run "
              "stops here, its last checkpoint is intact\n");
    ::_exit(2);
  }
  ::signal(sig, SIG_DFL);  // not a token file: the default action
  ::raise(sig);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, nullptr);
  });
}

// Returns the slot index, or -1 when every slot is in use (the file is then read unguarded).
int register_mapping(const void* base, size_t bytes, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (size_t i = 0; i < kMappingSlots; ++i) {
    MappingSlot& slot = g_mappings[i];
    if (slot.bytes.load() != 0) continue;
    std::snprintf(slot.path, sizeof(slot.path), "%s", path.c_str());
    slot.base = reinterpret_cast<uintptr_t>(base);
    slot.bytes = bytes;
    if (i + 1 > g_claimed.load()) g_claimed = i + 1;
    return static_cast<int>(i);
  }
  return -1;
}

void unregister_mapping(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  g_mappings[slot].bytes = 0;
}

}  // namespace

TokenFile::Mapping::~Mapping() {
  unregister_mapping(slot);
  if (base) ::munmap(base, bytes);
}

TokenFile TokenFile::open(const std::string& path) {
  require_regular_file(path);
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path, ": cannot open token file (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(path, ": cannot stat token file (", std::strerror(e), ")");
  }
  auto map = std::make_shared<Mapping>();
  map->path = path;
  map->bytes = static_cast<size_t>(st.st_size);
  if (map->bytes == 0) {
    ::close(fd);
    fail(path, ": token file is empty");
  }
  map->base = ::mmap(nullptr, map->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (map->base == MAP_FAILED) {
    map->base = nullptr;
    fail(path, ": cannot mmap token file (", std::strerror(e), ")");
  }
  install_sigbus_handler();
  map->slot = register_mapping(map->base, map->bytes, path);

  const auto* header = static_cast<const int32_t*>(map->base);
  const size_t header_bytes = kLlmcHeaderInts * sizeof(int32_t);
  if (map->bytes >= sizeof(int32_t) && (header[0] == kLlmcMagic || header[0] == kLlmcMagicUint32)) {
    require(map->bytes >= header_bytes, path, ": llm.c header truncated (file is ", map->bytes, " bytes, header needs ",
            header_bytes, ")");
    const bool wide = header[0] == kLlmcMagicUint32;
    require(header[1] == (wide ? kLlmcVersionUint32 : kLlmcVersionUint16), path, ": unsupported llm.c token file version ",
            header[1], " for magic ", header[0], " (read: ", kLlmcMagic, " version ", kLlmcVersionUint16, ", uint16 tokens; ",
            kLlmcMagicUint32, " version ", kLlmcVersionUint32, ", uint32 tokens)");
    map->width = wide ? 4 : 2;
    const int64_t declared = header[2];
    const int64_t held = static_cast<int64_t>(map->bytes - header_bytes);
    require(held == map->width * declared, path, ": header says ", declared, " tokens but the file holds ", held,
            " bytes of tokens (", held / map->width, " tokens); truncated or not an llm.c file");
    require(declared > 0, path, ": token file holds no tokens");
    map->tokens = static_cast<const char*>(map->base) + header_bytes;
    map->count = declared;
  } else {
    require(map->bytes % 2 == 0, path, ": size ", map->bytes,
            " bytes is not a multiple of 2 (raw uint16 token file without llm.c header)");
    map->tokens = map->base;
    map->count = static_cast<int64_t>(map->bytes / 2);
  }
  return TokenFile(std::move(map));
}

int64_t TokenFile::vocab_bound() const {
  int64_t bound = map_->vocab_bound.load(std::memory_order_relaxed);
  if (bound >= 0) return bound;
  uint32_t largest = 0;
  for (int64_t i = 0; i < map_->count; ++i) largest = std::max(largest, (*this)[i]);
  bound = int64_t(largest) + 1;
  map_->vocab_bound.store(bound, std::memory_order_relaxed);
  return bound;
}

at::Tensor TokenFile::window(int64_t begin, int64_t length) const {
  require(begin >= 0 && length >= 0 && begin + length <= map_->count, path(), ": window [", begin, ", ",
          begin + length, ") outside the file's ", map_->count, " tokens");
  at::Tensor out = at::empty({length}, at::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  // One branch on the width per window, not per token (the data loader's copy).
  if (map_->width == 2) {
    const auto* src = static_cast<const uint16_t*>(map_->tokens) + begin;
    for (int64_t i = 0; i < length; ++i) dst[i] = src[i];
  } else {
    const auto* src = static_cast<const uint32_t*>(map_->tokens) + begin;
    for (int64_t i = 0; i < length; ++i) dst[i] = src[i];
  }
  return out;
}

void write_token_file(const std::string& path, const std::vector<int64_t>& tokens) {
  require(tokens.size() < (size_t(1) << 31), path, ": ", tokens.size(), " tokens exceed the llm.c int32 count");
  int64_t largest = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    require(tokens[i] >= 0 && tokens[i] <= UINT32_MAX, path, ": token ", tokens[i], " at index ", i,
            " does not fit uint32");
    largest = std::max(largest, tokens[i]);
  }
  const bool wide = largest >= 65536;
  const size_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  std::string bytes(kLlmcHeaderInts * sizeof(int32_t) + tokens.size() * width, '\0');
  const int32_t header[kLlmcHeaderInts] = {wide ? kLlmcMagicUint32 : kLlmcMagic,
                                           wide ? kLlmcVersionUint32 : kLlmcVersionUint16,
                                           static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof(header));
  char* out = bytes.data() + sizeof(header);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (wide) {
      const auto token = static_cast<uint32_t>(tokens[i]);
      std::memcpy(out + i * width, &token, width);
    } else {
      const auto token = static_cast<uint16_t>(tokens[i]);
      std::memcpy(out + i * width, &token, width);
    }
  }
  write_file_atomic(path, bytes);
}

}  // namespace tessera
