// The host side of the swap engine (swap_owner.h).
#include "memory/swap/swap_owner.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "comm/group.h"
#include "core/error.h"
#include "memory/storage.h"
#include "optim/clipping.h"

namespace tessera {
SwapOwner::SwapOwner(const NamedParams& params, const std::vector<int64_t>& blocks, std::vector<int64_t> boundaries, const OptimOptions& optim,
                     c10::Device device, double modelled_bandwidth, comm::Group* replicas, bool bf16_copies)
    : swap::HostHome(boundaries.size()),
      device_(device),
      replicas_(replicas),
      load_link_(device, modelled_bandwidth),
      store_link_(device, modelled_bandwidth) {
  require(boundaries.size() >= 2, "internal: a swap cut of no sub-models");
  require(blocks.size() == params.size(), "internal: ", blocks.size(), " block indices for ", params.size(), " parameters");
  const int64_t subs = static_cast<int64_t>(boundaries.size()) - 1;
  units_.resize(static_cast<size_t>(subs) + 1);
  // Each parameter into its unit, in model order.
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    require(!p.is_cuda() && p.scalar_type() == at::kFloat, "internal: swapped parameter ", name,
            " must be built float32 on the host");
    const int64_t block = blocks[i];
    int64_t sub = subs;  // the ends
    if (block >= 0) {
      const auto it = std::upper_bound(boundaries.begin(), boundaries.end(), block);
      require(it != boundaries.begin() && it != boundaries.end(), "internal: block ", block, " is outside the swap cut");
      sub = (it - boundaries.begin()) - 1;
    }
    Unit& u = units_[static_cast<size_t>(sub)];
    order_.emplace_back(static_cast<size_t>(sub), u.entries.size());
    const int64_t offset = u.entries.empty() ? 0 : u.entries.back().offset + u.entries.back().numel;
    u.entries.push_back({name, p, {}, {}, offset, p.numel()});
  }
  int64_t total = 0, largest = 0;
  for (Unit& u : units_) {
    require(!u.entries.empty(), "internal: a swap unit without parameters");
    const int64_t n = u.entries.back().offset + u.entries.back().numel;
    total += n;
    largest = std::max(largest, n);
  }
  const auto host = at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(device.is_cuda());
  at::NoGradGuard no_grad;
  master_buffer_ = at::empty({total}, host);
  grad_buffer_ = at::zeros({total}, host);
  staging_ = at::empty({largest}, host);
  if (bf16_copies) copies_ = at::empty({total}, host.dtype(at::kBFloat16));
  int64_t at_offset = 0;
  for (Unit& u : units_) {
    const int64_t n = u.entries.back().offset + u.entries.back().numel;
    u.master = master_buffer_.narrow(0, at_offset, n);
    u.grad = grad_buffer_.narrow(0, at_offset, n);
    if (copies_.defined()) u.copy = copies_.narrow(0, at_offset, n);
    u.device = at::empty({n}, at::TensorOptions().dtype(at::kFloat).device(device));
    NamedParams named;
    for (Entry& e : u.entries) {
      e.master = u.master.narrow(0, e.offset, e.numel).view(e.param.sizes());
      e.grad = u.grad.narrow(0, e.offset, e.numel).view(e.param.sizes());
      e.master.copy_(e.param);
      e.param.set_data(u.device.narrow(0, e.offset, e.numel).view(e.param.sizes()));
      named.emplace_back(e.name, e.master);
    }
    release_storage(u.device);
    if (u.copy.defined()) u.copy.copy_(u.master);
    u.optimizer = make_optimizer(optim, std::move(named));
    at_offset += n;
  }
}

SwapOwner::~SwapOwner() { stop(); }

SwapOwner::Unit& SwapOwner::unit(int64_t sub) { return units_[swap::unit_of(sub, sub_models())]; }

std::function<void()> SwapOwner::load_job(size_t unit) {
  Unit& u = units_[unit];
  const at::Tensor& from = u.copy.defined() ? u.copy : u.master;  // bf16 copies: half the bytes
  const double bytes = static_cast<double>(from.numel() * from.element_size());
  return load_link_.job(
      [&u, from](bool non_blocking) {
        materialize_storage(u.device, static_cast<size_t>(u.device.numel()) * u.device.element_size());
        u.device.copy_(from, non_blocking);
      },
      bytes);
}

std::function<void()> SwapOwner::store_job(size_t unit) {
  Unit& u = units_[unit];
  const bool add = u.stored;  // a later micro-batch: land in the staging buffer, then add
  u.stored = true;
  double bytes = 0;
  for (const Entry& e : u.entries)
    if (e.param.grad().defined()) bytes += static_cast<double>(e.numel) * 4;
  auto copy = store_link_.job(
      [this, &u, add](bool non_blocking) {
        for (Entry& e : u.entries) {
          const at::Tensor& g = e.param.grad();
          if (!g.defined()) continue;
          at::Tensor into = add ? staging_.narrow(0, e.offset, e.numel).view(e.param.sizes()) : e.grad;
          into.copy_(g, non_blocking);
        }
      },
      bytes);
  return [this, &u, add, copy = std::move(copy)] {
    copy();
    at::NoGradGuard no_grad;
    for (Entry& e : u.entries) {
      const bool has = e.param.grad().defined();
      if (add && has && e.got_grad) e.grad.add_(staging_.narrow(0, e.offset, e.numel).view(e.param.sizes()));
      else if (add && has) e.grad.copy_(staging_.narrow(0, e.offset, e.numel).view(e.param.sizes()));
      else if (!add && !has) e.grad.zero_();
      e.got_grad = add ? e.got_grad || has : has;  // the step's first store starts afresh
      e.param.mutable_grad().reset();  // stored: the next backward starts a new gradient
    }
  };
}

void SwapOwner::evict(size_t unit) {
  Unit& u = units_[unit];
  if (device_.is_cuda()) {
    // The device copy came from the load stream's pool: the compute stream must be past its last
    // read before the memory can serve another load (event `computed`).
    c10::impl::VirtualGuardImpl guard(device_.type());
    c10::Event computed(device_.type());
    computed.record(guard.getDefaultStream(device_));
    computed.synchronize();
  }
  for (Entry& e : u.entries) e.param.mutable_grad().reset();
  release_storage(u.device);
}

void SwapOwner::reduce_gradients() {
  if (replicas_) {
    at::NoGradGuard no_grad;
    at::Tensor got = at::empty({static_cast<int64_t>(order_.size())}, at::kFloat);
    for (size_t k = 0; k < order_.size(); ++k) got[k] = units_[order_[k].first].entries[order_[k].second].got_grad ? 1.0 : 0.0;
    replicas_->all_reduce(got);
    replicas_->all_reduce(grad_buffer_);  // zeros where a replica got no gradient
    grad_buffer_.div_(static_cast<double>(replicas_->size()));
    const auto any = got.accessor<float, 1>();
    for (size_t k = 0; k < order_.size(); ++k) units_[order_[k].first].entries[order_[k].second].got_grad = any[k] > 0;
  }
}

double SwapOwner::gradients_stored(double max_norm) {
  std::vector<at::Tensor> grads;  // in model order, as a resident run's clipping sees them
  for (const auto& [u, i] : order_) {
    const Entry& e = units_[u].entries[i];
    if (e.got_grad) grads.push_back(e.grad);
  }
  return clip_gradients(grads, max_norm);
}

void SwapOwner::update(int64_t sub, double lr) {
  at::NoGradGuard no_grad;
  Unit& u = unit(sub);
  for (Entry& e : u.entries)
    if (e.got_grad) e.master.mutable_grad() = e.grad;
  u.optimizer->step(lr);
  u.optimizer->zero_grad();
  if (u.copy.defined()) u.copy.copy_(u.master);
  u.stored = false;  // the next step's first store overwrites the host gradients
}

void SwapOwner::end_step() {
  for (Unit& u : units_) {
    u.optimizer->zero_grad();
    u.stored = false;
    for (Entry& e : u.entries) {
      e.got_grad = false;
      e.param.mutable_grad().reset();
    }
  }
}

std::vector<at::Tensor> SwapOwner::final_gradients() {
  std::vector<at::Tensor> out;
  for (Unit& u : units_)
    for (Entry& e : u.entries) {
      if (!e.got_grad) {
        e.grad.zero_();
        e.got_grad = true;
      }
      out.push_back(e.grad);
    }
  return out;
}

UpdateResult SwapOwner::apply_written_gradients(double lr, double max_norm) {
  settle();
  UpdateResult result;
  result.grad_norm = at::scalar_tensor(gradients_stored(max_norm), at::kDouble);
  for (int64_t sub = 0; sub < sub_models(); ++sub) update(sub, lr);
  update(swap::kEnds, lr);
  return result;
}

std::vector<at::Tensor> SwapOwner::master_parameters() {
  settle();
  std::vector<at::Tensor> out;
  for (Unit& u : units_)
    for (Entry& e : u.entries) out.push_back(e.master);
  return out;
}

void SwapOwner::parameters_written() {
  for (Unit& u : units_)
    if (u.copy.defined()) u.copy.copy_(u.master);
}

void SwapOwner::settle() {
  if (settle_) settle_();
}

NamedTensors SwapOwner::gradients() {
  NamedTensors out;
  for (const auto& [u, i] : order_) {
    const Entry& e = units_[u].entries[i];
    out.emplace_back(e.name, e.got_grad ? e.grad.clone() : at::Tensor());
  }
  return out;
}

NamedTensors SwapOwner::training_state() {
  settle();
  NamedTensors out;
  for (Unit& u : units_)
    for (const auto& [name, t] : u.optimizer->state()) out.emplace_back("optim." + name, t);
  return out;
}

void SwapOwner::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  settle();
  const auto state = with_prefix(tensors, "optim.");
  for (Unit& u : units_) {
    std::map<std::string, at::Tensor> mine;
    for (const auto& [name, t] : u.optimizer->state()) {
      const auto it = state.find(name);
      if (it != state.end()) mine.emplace(name, it->second);
    }
    u.optimizer->load_state(mine, source);  // refuses what is missing, naming it
  }
  size_t known = 0;
  for (Unit& u : units_) known += u.optimizer->state().size();
  require(known == state.size(), source, ": ", state.size() - known, " optimizer state tensors name no parameter of this model");
}

// Every unit's optimizer is of the same kind (one per unit, same options).
StateKind SwapOwner::state_kind(const std::string& name) const {
  return units_.empty() ? StateKind::real : owned_state_kind(*units_.front().optimizer, name);
}

void SwapOwner::load_parameter(const std::string& name, const at::Tensor& value) {
  settle();
  at::NoGradGuard no_grad;
  for (Unit& u : units_)
    for (Entry& e : u.entries)
      if (e.name == name) {
        e.master.copy_(value);
        if (u.copy.defined()) u.copy.narrow(0, e.offset, e.numel).copy_(e.master.reshape(-1));
        return;
      }
  fail("internal: the swapped model has no parameter '", name, "'");
}

void SwapOwner::visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) {
  settle();
  for (int64_t sub = swap::kEnds; sub < sub_models(); ++sub) {
    const size_t u = swap::unit_of(sub, sub_models());
    fetch(u, {}).wait();
    std::vector<std::string> names;
    for (const Entry& e : units_[u].entries) names.push_back(e.name);
    fn(names);
    release(u, {});
  }
}

}  // namespace tessera
