// Moving whole files between ranks over a Group, for hosts that share no filesystem
// (checkpoint.gather: the checkpoint lives on rank 0's disk only).
//
// send_files / receive_files are one point-to-point exchange: the sender's regular files in
// `dir` (not its subdirectories), each as [name length, byte count], the name, then the bytes in
// chunks of at most kTransferChunk, so neither side holds a whole large file in memory (the format
// and the receiver's checks: file_receiver.h). The receiver writes each file into its `dir`
// (created; files fsync'ed) under the sender's file name and returns the names. Both sides must
// call at the same point, like a collective of two.
#pragma once

#include <string>
#include <vector>

#include "comm/file_receiver.h"
#include "comm/group.h"

namespace tessera::comm {

void send_files(Group& group, const std::string& dir, int64_t to);
std::vector<std::string> receive_files(Group& group, const std::string& dir, int64_t from);

}  // namespace tessera::comm
