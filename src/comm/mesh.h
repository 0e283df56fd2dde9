// comm::Mesh: the connected process mesh. It owns the rendezvous store, the world group and one
// group per mesh dimension (ParallelDims::group_names(): dp, tp, pp, sp, ep, dp_sp, edp, edp_sp,
// embedding, pp_down) holding this rank. Groups with the same members as one already built share
// it (with only data parallelism, "dp" is "world"; with ep = 1, "edp" is "dp"), so each distinct
// set of ranks has one backend and one ordered queue. The exceptions (when they have more than one
// member) get a group of their own, shared with no other dimension: "ep", so expert dispatch's
// all-to-alls never queue behind gradient buckets on "dp" when ep = dp; "pp_down", so a
// pipeline's transfers to a lower rank have connections of their own (Gloo stalls a send for
// milliseconds while the peer sends the other way on the same pair; measured in docs/pipeline.md).
//
// Every rank must call Mesh::connect with the same degrees; it returns when all groups of this
// rank are connected, or throws after parallel.timeout_s naming the rank and the group that did
// not assemble. A world of one process needs no store and no network. Connecting a world of
// several sets SIGPIPE to be ignored in this process: a dead peer's closed socket then fails the
// collective with a named error instead of killing the survivor silently. Its ranks beat a
// heartbeat (comm/heartbeat.h), so a group's failure names the rank that stopped answering.
//
// Backends (choose_backend): Gloo on the CPU, NCCL on CUDA (parallel.backend = auto picks by
// train.device). `device` is this process's own device, comm::select_device() (one GPU per local
// rank); an NCCL group is bound to it and connects its communicator eagerly inside connect(), so a
// group that cannot assemble fails there, not at its first collective. NCCL exists only in builds
// with TESSERA_CUDA=ON; elsewhere asking for it is refused, never replaced by Gloo.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "comm/group.h"
#include "comm/heartbeat.h"
#include "comm/rendezvous.h"
#include "core/parallel_dims.h"

namespace c10d {
class Store;
}

namespace tessera::comm {

// The backend a multi-process mesh uses: parallel.backend ("auto", "gloo", "nccl") for `device`.
// auto is nccl on a CUDA device and gloo on the CPU. Refused, naming parallel.backend and
// train.device: nccl without a CUDA device, nccl in a build without CUDA, gloo with a CUDA device.
std::string choose_backend(const std::string& backend, c10::Device device);

class Mesh {
 public:
  static std::unique_ptr<Mesh> connect(const LaunchInfo& launch, const ParallelDims& dims,
                                       const ParallelOptions& options, c10::Device device);
  ~Mesh();

  const ParallelDims& dims() const { return dims_; }
  const LaunchInfo& launch() const { return launch_; }
  int64_t rank() const { return launch_.rank; }
  int64_t world_size() const { return launch_.world_size; }
  c10::Device device() const { return device_; }
  MeshCoord coord() const { return dims_.coord(launch_.rank); }

  Group& world() { return *world_; }
  Group& group(const std::string& dim);

  // A further group over `ranks` (global, ascending). Every member calls it with the same name
  // and ranks, in the same order relative to other new_group calls; non-members must not call.
  std::unique_ptr<Group> new_group(const std::string& name, std::vector<int64_t> ranks);

 private:
  Mesh(LaunchInfo launch, ParallelDims dims, const ParallelOptions& options, c10::Device device);

  LaunchInfo launch_;
  ParallelDims dims_;
  c10::Device device_;
  std::string backend_name_;
  std::chrono::milliseconds timeout_;
  std::string local_address_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Heartbeat> heartbeat_;  // outlives the groups, whose failures it diagnoses
  std::vector<std::unique_ptr<Group>> owned_;
  Group* world_ = nullptr;
  std::map<std::string, Group*> groups_;
};

}  // namespace tessera::comm
