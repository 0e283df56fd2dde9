// Random streams for dropout under parallelism (Megatron-LM's CUDA RNG tracker, Shoeybi et al.
// 2019, section 3: "dropout ... within model parallel regions uses a different seed per rank").
//
// Two streams, each a generator state per device (the CPU, and each CUDA device used):
//   shared          torch's default generators. Every rank of a tensor-parallel group holds the
//                   same state (their replicated activations must get the same mask); ranks of
//                   different replicas (other dp, sp or pp coordinates) hold different states, so
//                   data-parallel ranks draw different masks for their different samples.
//   model_parallel  a state of its own, different on every rank: for dropout on activations that
//                   are split across the tensor-parallel ranks (attention probabilities of a
//                   rank's heads; the residual stream under Megatron sequence parallelism), whose
//                   masks must not repeat from rank to rank.
// Drawing from model_parallel (fork) runs a function with the device's default generator set to
// the stream's state and stores the advanced state back, so any op that uses the default
// generator (dropout, scaled_dot_product_attention's dropout) draws from the stream.
//
// Invariants:
// - seed_streams gives both streams states that depend only on (seed, replica, tp_rank): the run
//   is reproducible, and the shared stream is equal across a tp group by construction.
// - states() and load_states() cover every stream on the CPU and, when given, on one CUDA device:
//   activation checkpointing restores them for its recomputation (the masks repeat) and
//   checkpoints save them per rank (a resumed run draws what an uninterrupted one would).
// - A model_parallel state for a device is created on first use from the seed (or loaded).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace tessera::random {

enum class Stream { shared, model_parallel };

// Seeds the shared stream (torch's default generators: the CPU's, and `cuda`'s when given) and
// the model-parallel stream of this rank. `replica`: the rank's index among the replicas (its pp,
// dp and sp coordinates), equal on the ranks of one tp group; `tp_rank`: its tp coordinate.
void seed_streams(uint64_t seed, int64_t replica, int64_t tp_rank, std::optional<c10::Device> cuda = {});

// fn() drawing from `stream` on `device`'s generator (shared: runs fn as it is).
at::Tensor fork(Stream stream, c10::Device device, const std::function<at::Tensor()>& fn);

// Every stream's state on the CPU and on `cuda` (when given), named "<stream>.<device type>":
// "shared.cpu", "model_parallel.cpu", "shared.cuda", "model_parallel.cuda".
std::vector<std::pair<std::string, at::Tensor>> states(std::optional<c10::Device> cuda = {});
// Sets the states `states()` returned (on `cuda` for the ".cuda" ones). Throws tessera::Error
// naming `source` and the entry when one is unknown or a CUDA entry has no device.
void load_states(const std::vector<std::pair<std::string, at::Tensor>>& states, std::optional<c10::Device> cuda,
                 const std::string& source);

}  // namespace tessera::random
