// File-system helpers with the durability the checkpoint contract needs: files are fsync'ed,
// whole-file replacements go through a temporary name and rename(2), and renames are made
// durable by fsync'ing the parent directory.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// Throws naming `path` when it exists and is not a regular file (a FIFO, a device, a socket or a
// directory): every file tessera reads goes through this first, so a FIFO given as data or config
// is refused instead of blocking open(2) or read(2) forever; a path that cannot be examined (a
// symlink loop, a denied directory) is refused naming the reason. A missing path passes (the open
// that follows names it).
void require_regular_file(const std::string& path);
std::string read_file(const std::string& path);  // throws naming the path
void write_file_durable(const std::string& path, const std::string& bytes);  // fsync'ed
// The same for bytes in pieces, written in order without joining them first (large files).
void write_file_durable(const std::string& path, const std::vector<std::pair<const char*, size_t>>& pieces);
// Writes `path.tmp` then renames it over `path`; readers see the old or the new file, whole.
void write_file_atomic(const std::string& path, const std::string& bytes);
void fsync_directory(const std::string& path);

// 64-bit FNV-1a over the file's bytes, as 16 hex digits. Detects truncation and edits; not a
// cryptographic hash.
std::string file_checksum(const std::string& path);
// The same over bytes in memory.
std::string checksum(const std::string& bytes);

}  // namespace tessera
