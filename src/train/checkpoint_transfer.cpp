// checkpoint.gather (checkpoint_transfer.h).
#include "train/checkpoint_transfer.h"

#include <filesystem>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "comm/file_transfer.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The meta.json checksum as a number, 0 when `dir` holds no readable meta.json.
int64_t meta_fingerprint(const std::string& dir) {
  std::error_code error;
  const fs::path meta = fs::path(dir) / "meta.json";
  if (dir.empty() || !fs::is_regular_file(meta, error)) return 0;
  return static_cast<int64_t>(std::stoull(file_checksum(meta.string()), nullptr, 16) | 1);
}

// The step directory `path` resolves to on this rank, or "" when it does not exist here.
std::string resolve_here(const std::string& path) {
  try {
    return resolve_checkpoint_dir(path);
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

std::string gather_staging_dir(const std::string& run_dir, int64_t rank) {
  return (fs::path(run_dir) / (".gather-rank" + std::to_string(rank))).string();
}

void gather_checkpoint_files(comm::Group& world, const std::string& staging, const std::string& partial) {
  if (world.rank() == 0) {
    for (int64_t r = 1; r < world.size(); ++r) comm::receive_files(world, partial, r);
    fsync_directory(partial);
  } else {
    comm::send_files(world, staging, 0);
    fs::remove_all(staging);
  }
}

FetchedCheckpoint fetch_checkpoint(comm::Group& world, const std::string& path, const std::string& run_dir) {
  const std::string here = resolve_here(path);
  at::Tensor wanted = at::zeros({1}, at::kLong);
  if (world.rank() == 0) {
    require(!here.empty(), path, ": no checkpoint here on rank 0, which holds the run's checkpoints (checkpoint.gather)");
    wanted.fill_(meta_fingerprint(here));
  }
  world.broadcast(wanted, 0);
  at::Tensor has = at::empty({world.size()}, at::kLong);
  world.all_gather(has, at::full({1}, meta_fingerprint(here) == wanted.item<int64_t>() ? 1 : 0, at::kLong));
  FetchedCheckpoint fetched{here, ""};
  for (int64_t r = 1; r < world.size(); ++r) {
    if (has[r].item<int64_t>() == 1) continue;
    if (world.rank() == 0) comm::send_files(world, here, r);
    if (world.rank() == r) {
      fetched.received = (fs::path(run_dir) / (".received-rank" + std::to_string(r))).string();
      fs::remove_all(fetched.received);
      const std::string incoming = fetched.received + "/incoming";
      comm::receive_files(world, incoming, 0);
      // Named step_<N> as on rank 0: load_checkpoint checks the name against meta.json's step.
      const std::string meta = incoming + "/meta.json";
      fetched.dir = fetched.received + "/step_" + std::to_string(meta_field<int64_t>(read_json_file(meta), "step", meta));
      fs::rename(incoming, fetched.dir);
    }
  }
  return fetched;
}

}  // namespace tessera
