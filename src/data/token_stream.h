// Token data as one stream over shards. data.train_file and data.val_file name a file inside
// data.path or a glob of files (llm.c's data scripts write fineweb_train_000001.bin,
// fineweb_train_000002.bin, ... and fineweb_val_000000.bin), each an llm.c or raw uint16 token
// file (token_file.h), memory-mapped.
//
// Invariants:
// - The shards are the pattern's matches in lexicographic order of path, which is numeric order
//   for llm.c's zero-padded names; the stream is their concatenation, so token i of the stream is
//   a pure function of the shard list and a position names one shard and an offset in it.
// - A pattern that matches nothing is refused naming the pattern; so is a match that is not a
//   regular file or not a valid token file (TokenFile::open names it).
// - A window may span a shard boundary (the shards are one text as far as sampling knows; llm.c
//   separates documents with an end-of-text token, not by shard).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.h"

namespace tessera {

class TokenStream {
 public:
  // The files of `dir`/`pattern` (glob(7) syntax: *, ?, [..]); throws naming the pattern when
  // nothing matches.
  static TokenStream open(const std::string& dir, const std::string& pattern);
  explicit TokenStream(std::vector<TokenFile> shards, std::string name);

  int64_t size() const { return starts_.back(); }  // tokens in all shards
  int64_t vocab_bound() const;                     // largest token + 1 over all shards
  const std::string& name() const { return name_; }  // "dir/pattern", for messages
  const std::vector<TokenFile>& shards() const { return shards_; }

  struct Position {
    int64_t shard = 0;   // index into shards()
    int64_t offset = 0;  // token within that shard
  };
  Position locate(int64_t token) const;  // token < size()

  // Tokens [begin, begin + length) into `out`, across shard boundaries; throws naming the stream
  // when the range is outside it.
  void read(int64_t begin, int64_t length, int64_t* out) const;

  // [{"file": file name, "tokens": n}, ...] in stream order: what a
  // checkpoint records, so a resume on different data is refused instead of silently continuing.
  nlohmann::json manifest() const;

 private:
  std::vector<TokenFile> shards_;
  std::vector<int64_t> starts_;  // starts_[i] = first stream token of shard i; starts_.back() = size()
  std::string name_;
};

}  // namespace tessera
