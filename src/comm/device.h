// The device one process trains on: train.device resolved for this process's place on its node.
//
// One GPU per local rank: in a run of several processes per node, train.device = "cuda" means
// cuda:<local_rank>, so local rank L must see at least L + 1 CUDA devices (every process of a node
// sees all of the node's GPUs; a launcher that hands each process one GPU through
// CUDA_VISIBLE_DEVICES is refused with that reason). A single process gets cuda:0. An explicit
// "cuda:N" is allowed only when the node runs one process: given to several local ranks it would
// put all of them on one GPU. "cpu" is the CPU everywhere.
//
// Every refusal names train.device and the rank. resolve_device() is the rule alone (the visible
// device count is an argument); select_device() applies it to this process and makes the CUDA
// device current on the calling thread, before any CUDA work (NCCL communicators, the model).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "comm/rendezvous.h"

namespace tessera::comm {

c10::Device resolve_device(const std::string& train_device, const LaunchInfo& launch, int64_t visible_gpus);

// resolve_device with the CUDA devices this process sees (none in a build with TESSERA_CUDA=OFF);
// a CUDA result becomes the calling thread's current device.
c10::Device select_device(const std::string& train_device, const LaunchInfo& launch);

// `t` on `device`. A host tensor bound for a GPU goes through pinned memory and is copied without
// waiting, so the copy queues behind the device's work instead of holding the host until it drains.
at::Tensor to_device_queued(const at::Tensor& t, const c10::Device& device);

// The total memory of a CUDA device in bytes; 0 for the CPU (or a build without CUDA).
double device_memory_bytes(const c10::Device& device);

}  // namespace tessera::comm
