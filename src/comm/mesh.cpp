#include "comm/mesh.h"

#include <csignal>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/error.h"

namespace tessera::comm {
namespace {

std::string member_text(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

Mesh::Mesh(LaunchInfo launch, ParallelDims dims, const ParallelOptions& options, c10::Device device)
    : launch_(std::move(launch)),
      dims_(std::move(dims)),
      device_(device),
      timeout_(static_cast<int64_t>(options.timeout_s * 1000)) {
  backend_name_ = options.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : options.backend;
  if (launch_.world_size == 1) return;
  require(backend_name_ == "gloo" || device.is_cuda(), "parallel.backend = \"", backend_name_,
          "\" needs train.device = cuda (got ", device, ")");
  require(backend_name_ == "gloo", "parallel.backend = \"", backend_name_,
          "\": only gloo is built so far; use parallel.backend = \"gloo\"");
  require(!device.is_cuda(), "train.device = ", device,
          " with more than one process: CUDA collectives (NCCL) are not built yet; use train.device = cpu");
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
  }
  std::vector<int64_t> everyone(static_cast<size_t>(launch.world_size));
  for (int64_t r = 0; r < launch.world_size; ++r) everyone[static_cast<size_t>(r)] = r;
  m.owned_.push_back(m.new_group("world", everyone));
  m.world_ = m.owned_.back().get();
  for (const std::string& dim : ParallelDims::group_names()) {
    std::vector<int64_t> ranks = dims.group_of(dim, launch.rank);
    Group* same = nullptr;
    for (auto& g : m.owned_)
      if (g->ranks() == ranks) same = g.get();
    if (!same) {
      m.owned_.push_back(m.new_group(dim + "/" + member_text(ranks), ranks));
      same = m.owned_.back().get();
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
  if (ranks.size() > 1) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local_address_));
    options->threads = 1;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("tessera/" + name + "/", store_);
    try {
      backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank),
                                                            static_cast<int>(ranks.size()), options);
    } catch (const std::exception& e) {
      std::string what = e.what();
      fail("rank ", launch_.rank, ": group '", name, "' (ranks ", member_text(ranks), ") did not assemble within ",
           timeout_.count() / 1000.0, " s (parallel.timeout_s): ", what.substr(0, 300));
    }
  }
  return std::make_unique<Group>(name, std::move(ranks), rank, std::move(backend), timeout_);
}

}  // namespace tessera::comm
