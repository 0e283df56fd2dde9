// A callback after autograd's AccumulateGrad has stored a parameter's gradient in .grad (torch's
// post-accumulate-grad hook): DataParallel counts its buckets' arrivals with it, the ATOM swarm
// sends a gradient's share of an overlapped round from it. A parameter holds one such hook:
// setting one replaces the one before, and an empty `ready` removes it.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

namespace tessera {

void set_gradient_ready_hook(const at::Tensor& param, std::function<void()> ready);

}  // namespace tessera
