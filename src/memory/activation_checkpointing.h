// Activation checkpointing: run a segment without keeping its activations and recompute it in
// backward (reentrant style, as torch/utils/checkpoint.py's CheckpointFunction; libtorch has no
// C++ checkpoint, libtorch-notes §4.4).
//
// Forward runs fn under NoGradGuard and saves only the inputs, every random stream's state on the
// CPU and on the CUDA device the inputs live on (core/random_streams.h: the default generators and
// the model-parallel stream), and the autocast state. Backward forks the RNG (saves the
// current state, restores the forward's), recomputes fn under grad mode on detached copies of the
// inputs, calls torch::autograd::backward on the outputs with the incoming gradients (this
// accumulates the gradients of the parameters fn uses, as reentrant checkpointing does), puts the
// RNG back and returns the inputs' gradients. Hence dropout inside fn draws the same masks in the
// recomputation, and gradients equal those of running fn directly. The recomputation holds an
// AutocastCacheScope (precision/autocast.h): the weights autocast casts for it are dropped when it
// ends, not kept for the next step's forward.
//
// Invariants: at least one input must require grad (otherwise no graph node is created and the
// parameters inside fn get no gradient); fn must be deterministic given the RNG state.
#pragma once

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

namespace tessera {

using TensorList = std::vector<at::Tensor>;
using SegmentFn = std::function<TensorList(const TensorList&)>;

// The general form: several inputs, several outputs (e.g. a block's output and its MoE aux loss).
TensorList checkpoint(SegmentFn fn, const TensorList& inputs);

// One tensor in, one tensor out.
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input);

// Whether checkpointing a segment fed by x does anything: grad mode is on and x requires grad.
// (Under NoGradGuard, e.g. evaluation, segments run directly.)
bool checkpoint_applies(const at::Tensor& x);

// Whether this thread is recomputing a checkpointed segment in backward: a layer that counts what
// its forward saw (MoE routing statistics) counts the first forward only.
bool recomputing();

// The values of memory.activation_checkpointing.
enum class CheckpointMode { none, full, selective };

// Parses "none" | "full" | "selective"; throws tessera::Error naming memory.activation_checkpointing.
CheckpointMode parse_checkpoint_mode(const std::string& mode);

}  // namespace tessera
