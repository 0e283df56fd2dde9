// Read-only, memory-mapped token files. Two formats are read directly:
//
//   llm.c:   256 x int32 header (header[0] = 20240520 magic, header[1] = 1 version = uint16 tokens,
//            header[2] = token count), then header[2] little-endian uint16 tokens; or llm.c's
//            Llama 3 files, magic 20240801 version 7, uint32 tokens (vocabularies past 65536);
//   nanoGPT: raw little-endian uint16 tokens, no header (recognised by the absence of the magic).
//
// Invariants: an open TokenFile holds at least one token and its size agrees with its header; every
// error names the file. Copies share one mapping, which is unmapped when the last copy goes.
//
// A mapped file that shrinks while it is read (truncated or rewritten in place by another
// program) makes the next read of a page past its new end raise SIGBUS. The first open installs a
// SIGBUS handler that finds the mapping holding the faulting address (a registry of up to 4096
// live mappings, read lock-free in the handler), writes "error: PATH: the memory-mapped token file
// shrank ..." to stderr and exits with code 2, like any other data error; a SIGBUS elsewhere keeps
// its default action.
// `tessera prepare` writes the llm.c format (write_token_file): uint16 tokens, or uint32 where a
// token does not fit 16 bits.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersionUint16 = 1;
constexpr int32_t kLlmcMagicUint32 = 20240801;  // llm.c's Llama 3 files
constexpr int32_t kLlmcVersionUint32 = 7;
constexpr int64_t kLlmcHeaderInts = 256;

class TokenFile {
 public:
  static TokenFile open(const std::string& path);

  int64_t size() const { return map_->count; }  // number of tokens
  // Largest token + 1; computed by one pass over the file on first use, then cached.
  int64_t vocab_bound() const;
  // Tokens [begin, begin + length) as an int64 tensor [length] (a copy; bounds-checked).
  at::Tensor window(int64_t begin, int64_t length) const;
  // Token i, unchecked; i < size().
  uint32_t operator[](int64_t i) const {
    return map_->width == 2 ? static_cast<const uint16_t*>(map_->tokens)[i] : static_cast<const uint32_t*>(map_->tokens)[i];
  }
  const std::string& path() const { return map_->path; }

 private:
  struct Mapping {
    std::string path;
    void* base = nullptr;  // mmap'ed bytes of the whole file
    size_t bytes = 0;
    const void* tokens = nullptr;  // uint16 or uint32 (width bytes each)
    int64_t width = 2;
    int64_t count = 0;
    mutable std::atomic<int64_t> vocab_bound{-1};
    int slot = -1;  // in the SIGBUS handler's registry (token_file.cpp)
    ~Mapping();
  };
  explicit TokenFile(std::shared_ptr<const Mapping> map) : map_(std::move(map)) {}
  std::shared_ptr<const Mapping> map_;
};

// Writes `tokens` (each < 65536) to `path` in the llm.c format, through a temporary name and rename.
void write_token_file(const std::string& path, const std::vector<int64_t>& tokens);

}  // namespace tessera
