// The CUDA kernels of the fused cross-entropy (cross_entropy.h), behind a raw-pointer interface so
// that cross_entropy.cu includes no ATen header. Built only with TESSERA_CUDA=ON
// (TESSERA_WITH_CUDA); the launchers run on the given stream (a cudaStream_t) and throw
// std::runtime_error naming the kernel when the launch fails.
//
// logits: [rows, V] row-major, contiguous, bf16 (half = false) or fp16 (half = true), passed as
// void*; targets: int64 [rows], -1 for an ignored row, otherwise in [0, V) (a target outside it
// stops the kernel with a device-side trap, as an out-of-range gather does). One thread block
// per row; the math is float32.
#pragma once

#include <cstdint>

namespace tessera::kernels {

// loss[r] = logsumexp(logits[r]) - logits[r, target[r]] (0 for an ignored row); lse[r] the
// logsumexp, kept for the backward.
void cross_entropy_forward(const void* logits, bool half, const int64_t* targets, float* loss, float* lse,
                           int64_t rows, int64_t V, void* stream);

// dlogits[r] = dloss[r] * (softmax(logits[r]) - onehot(target[r])), in the logits' dtype; 0 for an
// ignored row.
void cross_entropy_backward(const void* logits, bool half, const int64_t* targets, const float* lse,
                            const float* dloss, void* dlogits, int64_t rows, int64_t V, void* stream);

}  // namespace tessera::kernels
