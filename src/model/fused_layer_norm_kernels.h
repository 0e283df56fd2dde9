// The CUDA kernels of the fused layer norm (fused_layer_norm.h), behind a raw-pointer interface so
// that fused_layer_norm.cu includes no ATen header. Built only with TESSERA_CUDA=ON
// (TESSERA_WITH_CUDA); the launchers run on the given stream (a cudaStream_t) and throw
// std::runtime_error naming the kernel when the launch fails.
//
// Rows of width C, row-major and contiguous. bf16 arrays are passed as void* (__nv_bfloat16 on the
// device). One warp normalises one row, holding it in registers: C is at most
// kFusedLayerNormMaxWidth.
#pragma once

#include <cstdint>

namespace tessera::kernels {

constexpr int kFusedLayerNormMaxWidth = 2048;

// sum = x + branch (when branch is not null; float32), out = layer_norm(sum or x) * w + b in bf16,
// mean and rstd per row (float32, for the backward). b may be null.
void layer_norm_forward(const float* x, const void* branch, const float* w, const float* b, float* sum, void* out,
                        float* mean, float* rstd, int64_t rows, int C, float eps, void* stream);

// How many partial rows the backward writes for dw and db (each [parts, C], summed by the caller).
int layer_norm_backward_parts(int64_t rows);

// From dout (bf16, the gradient of out) and the normalised input x with its mean and rstd:
// dx = layer_norm's input gradient (+ dsum, the gradient reaching the sum directly, when not null),
// written in float32 to dx and, when dbranch is not null, in bf16 to dbranch; dw and db as
// [layer_norm_backward_parts(rows), C] float32 partial sums.
void layer_norm_backward(const void* dout, const float* x, const float* mean, const float* rstd, const float* w,
                         const float* dsum, float* dx, void* dbranch, float* dw_parts, float* db_parts, int64_t rows,
                         int C, void* stream);

}  // namespace tessera::kernels
