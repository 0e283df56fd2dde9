// The int8 and fp8 encodings' CUDA kernels (activation_codec_kernels.h).
#include "memory/activation_codec_kernels.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

namespace tessera::kernels {
namespace {

constexpr int kWarps = 8;  // groups per block of threads
constexpr int kThreads = 32 * kWarps;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

template <typename T, bool kFp8>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const T* __restrict__ x, int64_t groups, int64_t group,
                                                            uint8_t* __restrict__ q, float* __restrict__ scales) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (g >= groups) return;
  const int lane = threadIdx.x % 32;
  const T* xs = x + g * group;
  unsigned largest = 0;
  for (int64_t i = lane; i < group; i += 32) largest = max(largest, __float_as_uint(to_float(xs[i])) & 0x7fffffffu);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  const float amax = __uint_as_float(largest);
  const float scale = amax > 0.f ? __fdiv_rn(amax, kFp8 ? 448.f : 127.f) : 1.f;
  if (lane == 0) scales[g] = scale;
  uint8_t* qs = q + g * group;
  for (int64_t i = lane; i < group; i += 32) {
    const float v = __fdiv_rn(to_float(xs[i]), scale);
    if (kFp8) {
      qs[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3));
    } else {
      const float r = fminf(fmaxf(rintf(v), -127.f), 127.f);
      qs[i] = static_cast<uint8_t>(static_cast<int8_t>(r));
    }
  }
}

template <typename T, bool kFp8>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales,
                                                              int64_t n, int64_t group, T* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v;
    if (kFp8) {
      v = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q[i]), __NV_E4M3)));
    } else {
      v = static_cast<float>(static_cast<int8_t>(q[i]));
    }
    out[i] = from_float<T>(__fmul_rn(v, scales[i / group]));
  }
}

void check(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + ": " + cudaGetErrorString(err));
}

template <typename T>
void quantize_as(const void* x, bool fp8, int64_t groups, int64_t group, void* q, float* scales, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((groups + kWarps - 1) / kWarps);
  if (fp8) {
    quantize_kernel<T, true><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), groups, group,
                                                         static_cast<uint8_t*>(q), scales);
  } else {
    quantize_kernel<T, false><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), groups, group,
                                                          static_cast<uint8_t*>(q), scales);
  }
  check("quantize_kernel");
}

template <typename T>
void dequantize_as(const void* q, const float* scales, bool fp8, int64_t groups, int64_t group, void* out, cudaStream_t s) {
  const int64_t n = groups * group;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
  if (fp8) {
    dequantize_kernel<T, true><<<blocks, kThreads, 0, s>>>(static_cast<const uint8_t*>(q), scales, n, group,
                                                           static_cast<T*>(out));
  } else {
    dequantize_kernel<T, false><<<blocks, kThreads, 0, s>>>(static_cast<const uint8_t*>(q), scales, n, group,
                                                            static_cast<T*>(out));
  }
  check("dequantize_kernel");
}

}  // namespace

void quantize_groups(const void* x, CodecDtype dtype, bool fp8, int64_t groups, int64_t group, void* q, float* scales,
                     void* stream) {
  if (groups == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case CodecDtype::float32: return quantize_as<float>(x, fp8, groups, group, q, scales, s);
    case CodecDtype::bfloat16: return quantize_as<__nv_bfloat16>(x, fp8, groups, group, q, scales, s);
    case CodecDtype::float16: return quantize_as<__half>(x, fp8, groups, group, q, scales, s);
  }
}

void dequantize_groups(const void* q, const float* scales, bool fp8, int64_t groups, int64_t group, void* out,
                       CodecDtype dtype, void* stream) {
  if (groups == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case CodecDtype::float32: return dequantize_as<float>(q, scales, fp8, groups, group, out, s);
    case CodecDtype::bfloat16: return dequantize_as<__nv_bfloat16>(q, scales, fp8, groups, group, out, s);
    case CodecDtype::float16: return dequantize_as<__half>(q, scales, fp8, groups, group, out, s);
  }
}

}  // namespace tessera::kernels
