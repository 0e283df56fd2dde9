// The fused cross-entropy's CUDA kernels (cross_entropy_kernels.h).
//
// One block of kThreads per row. The forward reads the row once, keeping a running (max, sum of
// exp(x - max)) per thread, combined across the block; the backward reads it once more and writes
// the gradient. Where the rows are 16-byte aligned (V a multiple of 8, as the model's padded
// vocabulary is), each thread moves 8 values per load and store.
#include "model/cross_entropy_kernels.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tessera::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

struct MaxSum {
  float m, s;  // the largest value seen, and the sum of exp(x - m) over the values seen
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) cross_entropy_forward_kernel(const T* __restrict__ logits,
                                                           const int64_t* __restrict__ targets,
                                                           float* __restrict__ loss, float* __restrict__ lse,
                                                           int64_t V) {
  const int64_t row = blockIdx.x;
  const T* l = logits + row * V;
  MaxSum acc{-INFINITY, 0.f};
  if (kVec) {
    const uint4* l8 = reinterpret_cast<const uint4*>(l);
    for (int64_t i = threadIdx.x; i < V / 8; i += kThreads) {
      const uint4 raw = l8[i];
      const T* v = reinterpret_cast<const T*>(&raw);
      float x[8], top = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[j] = to_float(v[j]);
        top = fmaxf(top, x[j]);
      }
      const float m = fmaxf(acc.m, top);
      float s = acc.s * __expf(acc.m - m);
#pragma unroll
      for (int j = 0; j < 8; ++j) s += __expf(x[j] - m);
      acc = {m, s};
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) acc = combine(acc, {to_float(l[i]), 1.f});
  }
  for (int offset = 16; offset > 0; offset /= 2)
    acc = combine(acc, {__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)});
  __shared__ MaxSum warps[kThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return;
  MaxSum total = warps[0];
  for (int w = 1; w < kThreads / 32; ++w) total = combine(total, warps[w]);
  const float L = total.m + logf(total.s);
  lse[row] = L;
  const int64_t target = targets[row];
  if (target >= V) __trap();
  loss[row] = target < 0 ? 0.f : L - to_float(l[target]);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) cross_entropy_backward_kernel(const T* __restrict__ logits,
                                                            const int64_t* __restrict__ targets,
                                                            const float* __restrict__ lse,
                                                            const float* __restrict__ dloss, T* __restrict__ dlogits,
                                                            int64_t V) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  const float g = target < 0 ? 0.f : dloss[row], L = lse[row];
  const T* l = logits + row * V;
  T* d = dlogits + row * V;
  if (kVec) {
    const uint4* l8 = reinterpret_cast<const uint4*>(l);
    uint4* d8 = reinterpret_cast<uint4*>(d);
    for (int64_t i = threadIdx.x; i < V / 8; i += kThreads) {
      const uint4 raw = l8[i];
      const T* v = reinterpret_cast<const T*>(&raw);
      uint4 out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p = __expf(to_float(v[j]) - L);
        o[j] = from_float<T>((8 * i + j == target ? p - 1.f : p) * g);
      }
      d8[i] = out;
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float p = __expf(to_float(l[i]) - L);
      d[i] = from_float<T>((i == target ? p - 1.f : p) * g);
    }
  }
}

void check(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("fused cross-entropy: ") + kernel + " failed to launch: " +
                             cudaGetErrorString(err));
}

bool aligned(const void* p, int64_t V) { return V % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void forward(const void* logits, const int64_t* targets, float* loss, float* lse, int64_t rows, int64_t V,
             cudaStream_t s) {
  const T* l = static_cast<const T*>(logits);
  if (aligned(logits, V)) cross_entropy_forward_kernel<T, true><<<rows, kThreads, 0, s>>>(l, targets, loss, lse, V);
  else cross_entropy_forward_kernel<T, false><<<rows, kThreads, 0, s>>>(l, targets, loss, lse, V);
}

template <typename T>
void backward(const void* logits, const int64_t* targets, const float* lse, const float* dloss, void* dlogits,
              int64_t rows, int64_t V, cudaStream_t s) {
  const T* l = static_cast<const T*>(logits);
  T* d = static_cast<T*>(dlogits);
  if (aligned(logits, V) && aligned(dlogits, V))
    cross_entropy_backward_kernel<T, true><<<rows, kThreads, 0, s>>>(l, targets, lse, dloss, d, V);
  else cross_entropy_backward_kernel<T, false><<<rows, kThreads, 0, s>>>(l, targets, lse, dloss, d, V);
}

}  // namespace

void cross_entropy_forward(const void* logits, bool half, const int64_t* targets, float* loss, float* lse,
                           int64_t rows, int64_t V, void* stream) {
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (half) forward<__half>(logits, targets, loss, lse, rows, V, s);
  else forward<__nv_bfloat16>(logits, targets, loss, lse, rows, V, s);
  check("forward");
}

void cross_entropy_backward(const void* logits, bool half, const int64_t* targets, const float* lse,
                            const float* dloss, void* dlogits, int64_t rows, int64_t V, void* stream) {
  if (rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (half) backward<__half>(logits, targets, lse, dloss, dlogits, rows, V, s);
  else backward<__nv_bfloat16>(logits, targets, lse, dloss, dlogits, rows, V, s);
  check("backward");
}

}  // namespace tessera::kernels
