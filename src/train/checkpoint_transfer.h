// checkpoint.gather: checkpoints of a run whose hosts share no filesystem.
//
// Saving: every rank r > 0 writes its checkpoint files (model shard, optimizer shard, compression
// state) into a staging directory on its own disk (gather_staging_dir), then
// gather_checkpoint_files sends them to rank 0, which writes them into the step's partial
// directory exactly as if rank r had written them there; rank 0 commits as usual. The checkpoint
// on rank 0's disk is therefore the ordinary format (checkpoint/checkpoint.h): `export`,
// `generate` and a resume at any layout read it unchanged.
//
// Resuming: rank 0 resolves the checkpoint and broadcasts its meta.json checksum; a rank that
// finds the same checkpoint at the same path (a shared directory, or a copy the user made) reads
// it in place, the others receive a copy from rank 0 into RUN_DIR/.received-rank<r>/step_<N>/
// (verified like any checkpoint when loaded, and deleted by the caller after loading).
#pragma once

#include <string>

#include "comm/group.h"

namespace tessera {

std::string gather_staging_dir(const std::string& run_dir, int64_t rank);

// Collective over `world`: ranks > 0 send the files in their `staging` directory (then delete
// it), rank 0 receives them into `partial`, rank by rank.
void gather_checkpoint_files(comm::Group& world, const std::string& staging, const std::string& partial);

struct FetchedCheckpoint {
  std::string dir;       // the step directory this rank loads
  std::string received;  // the copy's root to delete after loading ("" = read in place)
};

// Collective over `world`: `path` is what the user gave (step, checkpoints or run directory), as
// rank 0 sees it.
FetchedCheckpoint fetch_checkpoint(comm::Group& world, const std::string& path, const std::string& run_dir);

}  // namespace tessera
