// The receiving side of a file transfer (file_transfer.h) over any source of the sender's
// messages, so that what it reads from another process is one function, fuzzed without a process
// group (tests/fuzz/fuzz_file_transfer.cpp).
//
// The format, one point-to-point message each: the file count (one int64, kFileCountTag); per file
// a header [name length, byte count] (two int64s) and the name's bytes (kFileHeaderTag), then the
// bytes in chunks of at most kTransferChunk (kFileBytesTag). A name is a plain file name: not empty,
// under 4,096 bytes, without '/' or NUL, not "." or "..". A malformed header or name ends the
// transfer with a tessera::Error naming the sender; files already received stay.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::comm {

constexpr int64_t kTransferChunk = int64_t{64} << 20;
constexpr int64_t kFileCountTag = 7101, kFileHeaderTag = 7102, kFileBytesTag = 7103;

// Fills `into` (its size is the message's) with the sender's next message of `tag`.
using MessageSource = std::function<void(at::Tensor& into, int64_t tag)>;

// Writes each file into `dir` (created; files fsync'ed) under the sender's file name and returns
// the names. `sender` names the other side in errors ("rank 3").
std::vector<std::string> receive_files_from(const MessageSource& recv, const std::string& dir,
                                            const std::string& sender);

}  // namespace tessera::comm
