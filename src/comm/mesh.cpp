// comm::Mesh (mesh.h): the store, and one Gloo or NCCL backend per distinct group of ranks.
#include "comm/mesh.h"

#include <csignal>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TESSERA_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "core/error.h"

namespace tessera::comm {
namespace {

std::string member_text(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

#ifdef TESSERA_WITH_CUDA
// One NCCL communicator for the group on this process's GPU, bound to it and connected now
// (eagerly: every member is in Mesh::connect or new_group for the same group at this point).
// Its watchdog aborts an operation stuck past the same timeout as the Group's own waits.
c10::intrusive_ptr<c10d::Backend> nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                               const std::vector<int64_t>& ranks, int64_t rank, c10::Device device,
                                               std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  options->group_name = "tessera/" + name;
  options->group_desc = name;
  options->global_ranks_in_group.assign(ranks.begin(), ranks.end());
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                             static_cast<int>(ranks.size()), options);
  backend->setBoundDeviceId(device);
  backend->eagerConnectSingleDevice(device);
  return backend;
}
#endif

}  // namespace

std::string choose_backend(const std::string& backend, c10::Device device) {
  const std::string chosen = backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : backend;
  const std::string asked = "parallel.backend = \"" + backend + "\"" + (backend == "auto" ? " (nccl)" : "");
  if (chosen == "gloo") {
    require(!device.is_cuda(), asked, " with train.device = ", device,
            ": Gloo collectives run on CPU tensors here; use parallel.backend = \"nccl\" (or \"auto\") on CUDA");
    return chosen;
  }
  require(device.is_cuda(), asked, " needs train.device = cuda (got ", device, "); use parallel.backend = \"gloo\"");
#ifndef TESSERA_WITH_CUDA
  fail(asked, " with train.device = ", device,
       ": this build has TESSERA_CUDA=OFF, so it has no NCCL; rebuild with -DTESSERA_CUDA=ON or use train.device = cpu");
#endif
  return chosen;
}

Mesh::Mesh(LaunchInfo launch, ParallelDims dims, const ParallelOptions& options, c10::Device device)
    : launch_(std::move(launch)),
      dims_(std::move(dims)),
      device_(device),
      timeout_(static_cast<int64_t>(options.timeout_s * 1000)) {
  // A world of one has no backend, so parallel.backend is not checked there.
  backend_name_ = launch_.world_size == 1 ? "none" : choose_backend(options.backend, device);
}

std::unique_ptr<Mesh> Mesh::connect(const LaunchInfo& launch, const ParallelDims& dims, const ParallelOptions& options,
                                    c10::Device device) {
  require(dims.world_size() == launch.world_size, "internal: mesh of ", dims.world_size(), " ranks for a world of ",
          launch.world_size);
  std::unique_ptr<Mesh> mesh(new Mesh(launch, dims, options, device));
  Mesh& m = *mesh;
  if (launch.world_size > 1) {
    // A peer that died closes its sockets; writing to one must fail the collective with a named
    // error (EPIPE), not kill this process silently with SIGPIPE's default action.
    std::signal(SIGPIPE, SIG_IGN);
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(launch.master_port);
    store_options.isServer = launch.rank == 0 && !launch.agent_store;
    store_options.numWorkers = static_cast<size_t>(launch.world_size);
    store_options.waitWorkers = false;
    store_options.timeout = m.timeout_;
    if (store_options.isServer) {
      int fd = launch.store_fd;
      if (fd < 0) {
        const ListenSocket socket = listen_on(launch.master_addr, static_cast<int>(launch.master_port));
        fd = socket.fd;
        store_options.port = static_cast<uint16_t>(socket.port);
      }
      store_options.masterListenFd = fd;
    }
    try {
      m.store_ = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, store_options);
    } catch (const std::exception& e) {
      fail("rank ", launch.rank, ": cannot reach the rendezvous store at ", launch.master_addr, ":",
           launch.master_port, " within parallel.timeout_s = ", options.timeout_s, " s: ", e.what());
    }
    m.local_address_ = local_address_towards(launch.master_addr);
    const uint16_t port = static_cast<c10d::TCPStore&>(*m.store_).getPort();
    m.heartbeat_ = std::make_unique<Heartbeat>(
        launch.master_addr, port, launch.rank, launch.world_size,
        (launch.agent_store ? "torchrun's agent at " : "rank 0's process at ") + launch.master_addr + ":" +
            std::to_string(port));
    m.heartbeat_->watch(m.timeout_);
  }
  std::vector<int64_t> everyone(static_cast<size_t>(launch.world_size));
  for (int64_t r = 0; r < launch.world_size; ++r) everyone[static_cast<size_t>(r)] = r;
  m.owned_.push_back(m.new_group("world", everyone));
  m.world_ = m.owned_.back().get();
  std::vector<Group*> own;  // the groups of "ep" and "pp_down", shared with no other dimension (see mesh.h)
  for (const std::string& dim : ParallelDims::group_names()) {
    std::vector<int64_t> ranks = dims.group_of(dim, launch.rank);
    const bool alone = (dim == "ep" || dim == "pp_down") && ranks.size() > 1;
    Group* same = nullptr;
    for (auto& g : m.owned_)
      if (g->ranks() == ranks && std::find(own.begin(), own.end(), g.get()) == own.end() && !alone) same = g.get();
    if (!same) {
      m.owned_.push_back(m.new_group(dim + "/" + member_text(ranks), ranks));
      same = m.owned_.back().get();
      if (alone) own.push_back(same);
    }
    m.groups_[dim] = same;
  }
  return mesh;
}

Mesh::~Mesh() = default;

Group& Mesh::group(const std::string& dim) {
  auto it = groups_.find(dim);
  require(it != groups_.end(), "internal: no mesh group \"", dim, "\"");
  return *it->second;
}

std::unique_ptr<Group> Mesh::new_group(const std::string& name, std::vector<int64_t> ranks) {
  const auto me = std::find(ranks.begin(), ranks.end(), launch_.rank);
  require(me != ranks.end(), "internal: rank ", launch_.rank, " is not a member of group '", name, "'");
  const int64_t rank = me - ranks.begin();
  c10::intrusive_ptr<c10d::Backend> backend;
  const bool nccl = backend_name_ == "nccl";
  if (ranks.size() > 1) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("tessera/" + name + "/", store_);
    try {
      if (nccl) {
#ifdef TESSERA_WITH_CUDA  // without CUDA, choose_backend() never picks nccl
        backend = nccl_backend(prefixed, name, ranks, rank, device_, timeout_);
#endif
      } else {
        auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local_address_));
        options->threads = 1;
        backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank),
                                                              static_cast<int>(ranks.size()), options);
      }
    } catch (const std::exception& e) {
      std::string what = e.what();
      fail("rank ", launch_.rank, ": group '", name, "' (ranks ", member_text(ranks), ", ", backend_name_,
           ") did not assemble within ", timeout_.count() / 1000.0, " s (parallel.timeout_s): ", what.substr(0, 300));
    }
  }
  auto group = std::make_unique<Group>(name, std::move(ranks), rank, std::move(backend), timeout_,
                                       nccl ? device_ : c10::Device(c10::kCPU));
  if (heartbeat_) group->set_failure_diagnosis([heartbeat = heartbeat_.get()] { return heartbeat->diagnose(); });
  return group;
}

}  // namespace tessera::comm
