// The fused layer norm's CUDA kernels (fused_layer_norm_kernels.h).
//
// One warp per row, the row in registers: lane l holds columns l, l + 32, ... (VPL of them), so
// every load and store of a warp is 32 consecutive elements. Statistics are two-pass (the mean,
// then the mean of squared deviations) in float32. The backward accumulates dw and db per warp in
// registers over a fixed, strided set of rows and writes one partial row per warp: the caller sums
// the partials, so the result does not depend on scheduling (no atomics).
#include "model/fused_layer_norm_kernels.h"

#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tessera::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;

struct ForwardArgs {
  const float* x;
  const __nv_bfloat16* branch;
  const float *w, *b;
  float* sum;
  __nv_bfloat16* out;
  float *mean, *rstd;
  int64_t rows;
  int C;
  float eps;
};

struct BackwardArgs {
  const __nv_bfloat16* dout;
  const float *x, *mean, *rstd, *w, *dsum;
  float* dx;
  __nv_bfloat16* dbranch;
  float *dw_parts, *db_parts;
  int64_t rows;
  int C;
};
constexpr int kMaxParts = 2048;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int VPL>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) layer_norm_forward_kernel(const ForwardArgs a) {
  const float* __restrict__ x = a.x;
  const __nv_bfloat16* __restrict__ branch = a.branch;
  const float* __restrict__ w = a.w;
  const float* __restrict__ b = a.b;
  float* __restrict__ sum = a.sum;
  __nv_bfloat16* __restrict__ out = a.out;
  const int64_t rows = a.rows;
  const int C = a.C;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t base = row * C;
  float v[VPL];
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int c = lane + 32 * i;
    v[i] = 0.f;
    if (c < C) {
      v[i] = x[base + c];
      if (branch != nullptr) {
        v[i] += __bfloat162float(branch[base + c]);
        sum[base + c] = v[i];
      }
      total += v[i];
    }
  }
  const float mean = warp_sum(total) / C;
  float squares = 0.f;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int c = lane + 32 * i;
    if (c < C) squares += (v[i] - mean) * (v[i] - mean);
  }
  const float rstd = rsqrtf(warp_sum(squares) / C + a.eps);
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int c = lane + 32 * i;
    if (c < C) out[base + c] = __float2bfloat16((v[i] - mean) * rstd * w[c] + (b != nullptr ? b[c] : 0.f));
  }
  if (lane == 0) {
    a.mean[row] = mean;
    a.rstd[row] = rstd;
  }
}

template <int VPL>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) layer_norm_backward_kernel(const BackwardArgs a) {
  const __nv_bfloat16* __restrict__ dout = a.dout;
  const float* __restrict__ x = a.x;
  const float* __restrict__ mean = a.mean;
  const float* __restrict__ rstd = a.rstd;
  const float* __restrict__ w = a.w;
  const float* __restrict__ dsum = a.dsum;
  float* __restrict__ dx = a.dx;
  __nv_bfloat16* __restrict__ dbranch = a.dbranch;
  const int64_t rows = a.rows;
  const int C = a.C;
  const int warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int lane = threadIdx.x % 32;
  float dw[VPL], db[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) dw[i] = db[i] = 0.f;
  for (int64_t row = warp; row < rows; row += warps) {
    const int64_t base = row * C;
    const float m = mean[row], r = rstd[row];
    float xhat[VPL], g[VPL];
    float g_total = 0.f, gx_total = 0.f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int c = lane + 32 * i;
      xhat[i] = g[i] = 0.f;
      if (c < C) {
        const float d = __bfloat162float(dout[base + c]);
        xhat[i] = (x[base + c] - m) * r;
        g[i] = d * w[c];
        dw[i] += d * xhat[i];
        db[i] += d;
        g_total += g[i];
        gx_total += g[i] * xhat[i];
      }
    }
    const float g_mean = warp_sum(g_total) / C, gx_mean = warp_sum(gx_total) / C;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int c = lane + 32 * i;
      if (c < C) {
        float d = r * (g[i] - g_mean - xhat[i] * gx_mean);
        if (dsum != nullptr) d += dsum[base + c];
        dx[base + c] = d;
        if (dbranch != nullptr) dbranch[base + c] = __float2bfloat16(d);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    const int c = lane + 32 * i;
    if (c < C) {
      a.dw_parts[static_cast<int64_t>(warp) * C + c] = dw[i];
      a.db_parts[static_cast<int64_t>(warp) * C + c] = db[i];
    }
  }
}

void check(const char* kernel, int C) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("fused layer norm: ") + kernel + " (width " + std::to_string(C) +
                             ") failed to launch: " + cudaGetErrorString(err));
}

template <int VPL>
struct Forward {
  static void launch(const ForwardArgs& a, unsigned blocks, cudaStream_t stream) {
    layer_norm_forward_kernel<VPL><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a);
  }
};

template <int VPL>
struct Backward {
  static void launch(const BackwardArgs& a, unsigned blocks, cudaStream_t stream) {
    layer_norm_backward_kernel<VPL><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a);
  }
};

// Launches Kernel<VPL> with the smallest instantiated VPL (values per lane) with 32 * VPL >= C.
template <template <int> class Kernel, typename Args>
void launch(const char* name, const Args& a, unsigned blocks, void* stream) {
  const int C = a.C;
  if (C <= 0 || C > kFusedLayerNormMaxWidth)
    throw std::runtime_error("fused layer norm: width " + std::to_string(C) + " outside [1, " +
                             std::to_string(kFusedLayerNormMaxWidth) + "]");
  const auto s = static_cast<cudaStream_t>(stream);
  const int need = (C + 31) / 32;
  if (need <= 4) Kernel<4>::launch(a, blocks, s);
  else if (need <= 8) Kernel<8>::launch(a, blocks, s);
  else if (need <= 12) Kernel<12>::launch(a, blocks, s);
  else if (need <= 16) Kernel<16>::launch(a, blocks, s);
  else if (need <= 24) Kernel<24>::launch(a, blocks, s);
  else if (need <= 32) Kernel<32>::launch(a, blocks, s);
  else if (need <= 48) Kernel<48>::launch(a, blocks, s);
  else Kernel<64>::launch(a, blocks, s);
  check(name, C);
}

}  // namespace

void layer_norm_forward(const float* x, const void* branch, const float* w, const float* b, float* sum, void* out,
                        float* mean, float* rstd, int64_t rows, int C, float eps, void* stream) {
  if (rows == 0) return;
  const ForwardArgs a{x, static_cast<const __nv_bfloat16*>(branch), w, b, sum, static_cast<__nv_bfloat16*>(out),
                      mean, rstd, rows, C, eps};
  launch<Forward>("forward", a, static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), stream);
}

int layer_norm_backward_parts(int64_t rows) {
  // about 16 rows per warp, whole blocks, at most kMaxParts warps
  int64_t warps = (rows + 15) / 16;
  warps = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock * kWarpsPerBlock;
  if (warps < kWarpsPerBlock) warps = kWarpsPerBlock;
  return static_cast<int>(warps < kMaxParts ? warps : kMaxParts);
}

void layer_norm_backward(const void* dout, const float* x, const float* mean, const float* rstd, const float* w,
                         const float* dsum, float* dx, void* dbranch, float* dw_parts, float* db_parts, int64_t rows,
                         int C, void* stream) {
  const BackwardArgs a{static_cast<const __nv_bfloat16*>(dout), x, mean, rstd, w, dsum, dx,
                       static_cast<__nv_bfloat16*>(dbranch), dw_parts, db_parts, rows, C};
  launch<Backward>("backward", a, static_cast<unsigned>(layer_norm_backward_parts(rows) / kWarpsPerBlock), stream);
}

}  // namespace tessera::kernels
