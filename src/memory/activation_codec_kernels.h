// The CUDA kernels of the saved-activation encodings int8 and fp8 (activation_codec.h), behind a
// raw-pointer interface so that activation_codec.cu includes no ATen header. Built only with
// TESSERA_CUDA=ON (TESSERA_WITH_CUDA); the launchers run on the given stream (a cudaStream_t) and
// throw std::runtime_error naming the kernel when the launch fails.
//
// One warp per group of `group` consecutive elements. The arithmetic is the CPU kernels': amax the
// largest magnitude (as the largest bit pattern with the sign cleared), scale = amax / 127 (int8)
// or amax / 448 (fp8 e4m3) by IEEE division, 1 for an all-zero group; x / scale by IEEE division,
// rounded half to even and clamped to +-127 (int8) or converted with rounding to nearest and no
// saturation (fp8, as c10's Float8_e4m3fn); decoding q * scale rounded to nearest into the
// output's dtype. So an encoding made on the GPU equals the CPU's bit for bit
// (GpuActivationCodec.EncodesAsTheCpuKernelsDo).
#pragma once

#include <cstdint>

namespace tessera::kernels {

// Element types of the unpacked tensor.
enum class CodecDtype { float32, bfloat16, float16 };

// x: [groups, group] contiguous; q: [groups, group] bytes (int8 or e4m3); scales: [groups] float.
void quantize_groups(const void* x, CodecDtype dtype, bool fp8, int64_t groups, int64_t group, void* q, float* scales,
                     void* stream);

// out: [groups, group] contiguous in `dtype`.
void dequantize_groups(const void* q, const float* scales, bool fp8, int64_t groups, int64_t group, void* out,
                       CodecDtype dtype, void* stream);

}  // namespace tessera::kernels
