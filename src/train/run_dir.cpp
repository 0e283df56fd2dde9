// Claiming and locking a run directory (run_dir.h).
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <limits>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/fs.h"
#include "tensorboard/event_file.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

// What a run writes into its directory once it has been claimed (trainer.cpp). Not among them:
// run.lock, which marks a directory that was used, not a run; and logs/, which the launchers of
// every node create before they start their workers (a node other than 0 may do so before node 0
// has claimed the directory), and whose per-rank files a new run truncates.
const char* const kRunFiles[] = {"config.toml", "metrics.jsonl", EventFileWriter::kFileName, "train.log", "checkpoints"};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::vector<std::string> run_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const char* name : kRunFiles) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p)) out.push_back(fs::is_directory(p) ? std::string(name) + "/" : std::string(name));
  }
  return out;
}

std::string run_dir_of_checkpoint(const std::string& checkpoint_dir) {
  const fs::path parent = fs::weakly_canonical(fs::path(checkpoint_dir)).parent_path();
  return parent.filename() == "checkpoints" ? parent.parent_path().string() : "";
}

RunLock::RunLock(const std::string& dir) {
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / "run.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  require(fd_ >= 0, path, ": cannot open the run lock: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    require(err == EWOULDBLOCK, path, ": cannot lock: ", std::strerror(err));
    std::string holder = read_file(path);
    holder.erase(holder.find_last_not_of(" \n") + 1);
    fail(dir, " is in use by another run (", holder.empty() ? "pid unknown" : holder,
         "): wait for it to finish or stop it, or train into another --out");
  }
  const std::string mine = "pid " + std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()))
    fail(path, ": cannot write the run lock: ", std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// What claiming `dir` does: the run files it holds and whether they stay (the run continues in
// place) or go (--overwrite); throws when the rules refuse the claim.
struct ClaimDecision {
  std::vector<std::string> held;
  bool continues = false;
};

ClaimDecision decide_claim(const std::string& dir, const RunClaim& claim) {
  ClaimDecision d{run_files(dir), false};
  if (d.held.empty()) return d;
  const std::string resumed_run = claim.resume_from.empty() ? "" : run_dir_of_checkpoint(claim.resume_from);
  d.continues = !resumed_run.empty() && fs::equivalent(resumed_run, dir);
  require(d.continues || claim.overwrite, dir, " already holds a run (", joined(d.held), "): continue it with --resume ",
          dir, ", start it over with --overwrite (deletes those), or train into another --out");
  return d;
}

}  // namespace

std::string describe_claim(const std::string& dir, const RunClaim& claim) {
  const ClaimDecision d = decide_claim(dir, claim);
  if (d.held.empty()) return dir + (fs::exists(dir) ? " (holds no run)" : " (new)");
  return dir + (d.continues ? " (the run continues in place)" : " (its run is deleted first: " + joined(d.held) + ")");
}

void check_shared_run_dir(const std::string& dir, comm::Group& world, bool gather) {
  if (world.size() == 1) return;
  const std::string path = (fs::path(dir) / ".shared-check").string();
  at::Tensor token = at::zeros({2}, at::kLong);
  if (world.rank() == 0) {
    token = at::randint(1, std::numeric_limits<int64_t>::max(), {2}, at::kLong);
    fs::create_directories(dir);
    write_file_durable(path, std::to_string(token[0].item<int64_t>()) + std::to_string(token[1].item<int64_t>()));
  }
  world.broadcast(token, 0);
  const std::string expected = std::to_string(token[0].item<int64_t>()) + std::to_string(token[1].item<int64_t>());
  std::error_code error;
  const bool sees = fs::is_regular_file(path, error) && read_file(path) == expected;
  at::Tensor seen = at::empty({world.size()}, at::kLong);
  world.all_gather(seen, at::full({1}, sees ? 1 : 0, at::kLong));
  world.barrier();
  if (world.rank() == 0) fs::remove(path, error);
  std::string blind;
  for (int64_t r = 0; r < world.size(); ++r)
    if (seen[r].item<int64_t>() == 0) blind += (blind.empty() ? "" : ", ") + std::to_string(world.global_rank_of(r));
  require(blind.empty() || gather, "the run directory ", dir, " is not shared by all ranks: rank(s) ", blind,
          " cannot see the file rank 0 wrote there. Every rank writes its checkpoint shards into --out, so on "
          "several hosts it must be one directory all of them see (a shared filesystem mounted at the same "
          "path, or given to each node's launcher as its --out), or set checkpoint.gather = true: rank 0 then "
          "writes whole checkpoints into its own --out");
}

std::unique_ptr<RunLock> claim_run_dir(const std::string& dir, const RunClaim& claim) {
  auto lock = std::make_unique<RunLock>(dir);
  const ClaimDecision d = decide_claim(dir, claim);
  if (!d.continues)
    for (const std::string& name : d.held) fs::remove_all(fs::path(dir) / name);
  for (const std::string& name : remove_interrupted_saves(dir + "/checkpoints"))
    std::printf("removed %s/checkpoints/%s: a checkpoint save that did not finish\n", dir.c_str(), name.c_str());
  return lock;
}

}  // namespace tessera
