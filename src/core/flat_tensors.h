// A list of tensors as one flat float32 vector and back: each tensor is its run of elements, in
// list order. The gradient compressors' buckets and the swarm's averaged state are such vectors.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

// The tensors, detached, flattened in order into one new contiguous float32 tensor on their
// device: [sum of numel].
at::Tensor flatten_float(const std::vector<at::Tensor>& tensors);

// Copies consecutive runs of `flat` into `tensors` in place (no autograd record), each converted to
// its tensor's dtype. `flat` holds at least the tensors' numel in all.
void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);

}  // namespace tessera
