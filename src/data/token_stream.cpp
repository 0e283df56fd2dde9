// TokenStream: shards matched by a glob, read as one stream (token_stream.h).
#include "data/token_stream.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace tessera {
namespace fs = std::filesystem;

TokenStream TokenStream::open(const std::string& dir, const std::string& pattern) {
  const std::string full = (fs::path(dir) / pattern).string();
  glob_t matches{};
  const int status = ::glob(full.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  if (status == GLOB_NOMATCH || paths.empty()) {
    const bool wildcard = pattern.find_first_of("*?[") != std::string::npos;
    fail(full, wildcard ? ": the pattern matches no file" : ": no such token file");
  }
  require(status == 0, full, ": cannot list the files of the pattern");
  std::sort(paths.begin(), paths.end());
  std::vector<TokenFile> shards;
  for (const std::string& path : paths) shards.push_back(TokenFile::open(path));
  return TokenStream(std::move(shards), full);
}

TokenStream::TokenStream(std::vector<TokenFile> shards, std::string name)
    : shards_(std::move(shards)), name_(std::move(name)) {
  require(!shards_.empty(), name_, ": no token files");
  starts_.push_back(0);
  for (const TokenFile& shard : shards_) starts_.push_back(starts_.back() + shard.size());
}

int64_t TokenStream::vocab_bound() const {
  int64_t bound = 0;
  for (const TokenFile& shard : shards_) bound = std::max(bound, shard.vocab_bound());
  return bound;
}

TokenStream::Position TokenStream::locate(int64_t token) const {
  const auto after = std::upper_bound(starts_.begin(), starts_.end(), token);
  const int64_t shard = (after - starts_.begin()) - 1;
  return {shard, token - starts_[static_cast<size_t>(shard)]};
}

void TokenStream::read(int64_t begin, int64_t length, int64_t* out) const {
  require(begin >= 0 && length >= 0 && begin + length <= size(), name_, ": window [", begin, ", ", begin + length,
          ") outside the stream's ", size(), " tokens");
  int64_t done = 0;
  while (done < length) {
    const Position at = locate(begin + done);
    const TokenFile& shard = shards_[static_cast<size_t>(at.shard)];
    const int64_t n = std::min(length - done, shard.size() - at.offset);
    for (int64_t i = 0; i < n; ++i) out[done + i] = shard[at.offset + i];
    done += n;
  }
}

nlohmann::json TokenStream::manifest() const {
  nlohmann::json out = nlohmann::json::array();
  for (const TokenFile& shard : shards_)
    out.push_back({{"file", fs::path(shard.path()).filename().string()}, {"tokens", shard.size()}});
  return out;
}

}  // namespace tessera
