// Saved-activation encodings (activation_codec.h).
#include "memory/activation_codec.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/accumulate.h>

#include "core/error.h"
#include "core/vector_kernel.h"
#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "memory/activation_codec_kernels.h"
#endif

namespace tessera {
namespace {

// Bit i of byte j holds element 8 j + i.
at::Tensor bit_weights(const at::Device& device) {
  return at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::TensorOptions().dtype(at::kByte)).to(device);
}

EncodedTensor pack_bits(const at::Tensor& t) {
  EncodedTensor e;
  e.form = EncodedTensor::Form::bits;
  e.sizes = t.sizes().vec();
  e.dtype = t.scalar_type();
  at::Tensor flat = t.reshape({-1}).to(at::kByte);
  const int64_t n = flat.numel(), padded = (n + 7) / 8 * 8;
  if (padded != n) flat = at::constant_pad_nd(flat, {0, padded - n});
  e.data = flat.view({-1, 8}).mul(bit_weights(t.device())).sum(1, false, at::kByte);
  return e;
}

at::Tensor unpack_bits(const EncodedTensor& e) {
  const int64_t n = c10::multiply_integers(e.sizes);
  at::Tensor bits = e.data.unsqueeze(1).bitwise_and(bit_weights(e.data.device())).ne(0).reshape({-1});
  return bits.narrow(0, 0, n).view(e.sizes).to(e.dtype);
}

// [groups, group] view of t's elements in order, the group as activation_codec.h says.
at::Tensor grouped(const at::Tensor& t) {
  const int64_t last = t.size(-1);
  return t.contiguous().view({-1, last % kActivationGroup == 0 ? kActivationGroup : last});
}

// The int8 kernels on the CPU (core/vector_kernel.h), int4's with a top of 7. 4 MB of float32 on
// this machine's cores: encoding 1.0 ms and decoding 0.3 ms on one thread (ATen's composite
// expression: 5.1 ms).

// Each group: its largest magnitude (as the largest bit pattern with the sign cleared, which
// orders non-negative floats and vectorises as an integer maximum), scale = amax / top (1 for an
// all-zero group), x / scale rounded to nearest with ties to even (adding and subtracting
// 1.5 * 2^23, exact for |v| < 2^22; the compiler may not fold it, float addition not being
// associative) and clamped to +-top. The arithmetic of the ATen expression other devices run.
TESSERA_VECTOR_KERNEL
void quantize_groups_cpu(const float* x, int64_t groups, int64_t group, float top, int8_t* q, float* scales) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* xs = x + g * group;
    uint32_t largest = 0;
    for (int64_t i = 0; i < group; ++i) {
      uint32_t bits;
      std::memcpy(&bits, xs + i, sizeof bits);
      bits &= 0x7fffffffu;
      largest = bits > largest ? bits : largest;
    }
    float amax;
    std::memcpy(&amax, &largest, sizeof amax);
    const float scale = amax > 0 ? amax / top : 1.0f;
    scales[g] = scale;
    int8_t* qs = q + g * group;
    for (int64_t i = 0; i < group; ++i) {
      float v = (xs[i] / scale + 12582912.0f) - 12582912.0f;
      v = v < -top ? -top : v;
      v = v > top ? top : v;
      qs[i] = static_cast<int8_t>(static_cast<int32_t>(v));
    }
  }
}

TESSERA_VECTOR_KERNEL
void dequantize_int8_cpu(const int8_t* q, const float* scales, int64_t groups, int64_t group, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = scales[g];
    for (int64_t i = 0; i < group; ++i) out[g * group + i] = static_cast<float>(q[g * group + i]) * scale;
  }
}

// int4's codes two to a byte as pack_nibbles (below) lays them out, and back.
TESSERA_VECTOR_KERNEL
void pack_nibbles_cpu(const int8_t* q, int64_t pairs, uint8_t* out) {
  for (int64_t i = 0; i < pairs; ++i)
    out[i] = static_cast<uint8_t>((q[2 * i] + 8) | ((q[2 * i + 1] + 8) << 4));
}

TESSERA_VECTOR_KERNEL
void unpack_nibbles_cpu(const uint8_t* in, int64_t pairs, int8_t* q) {
  for (int64_t i = 0; i < pairs; ++i) {
    q[2 * i] = static_cast<int8_t>((in[i] & 15) - 8);
    q[2 * i + 1] = static_cast<int8_t>((in[i] >> 4) - 8);
  }
}

// Groups per task of at::parallel_for: about 64 KB of float32.
int64_t grain(int64_t group) { return std::max<int64_t>(1, 16384 / group); }
// Groups whose int4 codes (a byte each before packing) pass through an 8 KiB buffer at a time,
// which stays in the core's cache between quantizing and packing.
int64_t cached_groups(int64_t group) { return std::max<int64_t>(1, 8192 / group); }

#ifdef TESSERA_WITH_CUDA
// The CUDA kernels' name for a dtype they take (activation_codec_kernels.h); none for another.
std::optional<kernels::CodecDtype> codec_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return kernels::CodecDtype::float32;
    case at::kBFloat16: return kernels::CodecDtype::bfloat16;
    case at::kHalf: return kernels::CodecDtype::float16;
    default: return std::nullopt;
  }
}
#endif

// int4's codes two to a byte: element 2 i in the low four bits, 2 i + 1 in the high, each plus 8
// (q [groups, group] int8 in [-7, 7]; an odd count's last byte has 8 in its high half).
at::Tensor pack_nibbles(const at::Tensor& q) {
  at::Tensor flat = q.reshape({-1}).add(8).to(at::kByte);
  if (flat.numel() % 2 != 0) flat = at::constant_pad_nd(flat, {0, 1}, 8);
  const at::Tensor pairs = flat.view({-1, 2});
  return pairs.select(1, 0).bitwise_or(pairs.select(1, 1).bitwise_left_shift(4));
}

// The codes of e (int4) as int8 [groups, group].
at::Tensor unpack_nibbles(const EncodedTensor& e) {
  const int64_t groups = e.scales.size(0), n = c10::multiply_integers(e.sizes);
  const at::Tensor codes = at::stack({e.data.bitwise_and(15), e.data.bitwise_right_shift(4)}, 1).view({-1});
  return codes.narrow(0, 0, n).to(at::kChar).sub(8).view({groups, n / groups});
}

EncodedTensor quantize(const at::Tensor& t, EncodedTensor::Form form) {
  const bool fp8 = form == EncodedTensor::Form::fp8, int4 = form == EncodedTensor::Form::int4;
  const float top = int4 ? 7.0f : 127.0f;
  EncodedTensor e;
  e.form = form;
  e.sizes = t.sizes().vec();
  e.dtype = t.scalar_type();
#ifdef TESSERA_WITH_CUDA
  if (const auto dtype = codec_dtype(t.scalar_type()); t.is_cuda() && dtype && !int4) {
    const c10::cuda::CUDAGuard guard(t.device());
    const at::Tensor x = grouped(t);
    e.data = at::empty(x.sizes(), x.options().dtype(fp8 ? at::kFloat8_e4m3fn : at::kChar));
    e.scales = at::empty({x.size(0), 1}, x.options().dtype(at::kFloat));
    kernels::quantize_groups(x.data_ptr(), *dtype, fp8, x.size(0), x.size(1), e.data.data_ptr(),
                             e.scales.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
    return e;
  }
#endif
  const at::Tensor x = grouped(t).to(at::kFloat);
  if (x.is_cpu() && int4 && x.size(1) % 2 == 0) {  // each group whole bytes: quantized and packed a task at a time
    const int64_t groups = x.size(0), group = x.size(1);
    e.data = at::empty({groups * group / 2}, x.options().dtype(at::kByte));
    e.scales = at::empty({groups, 1}, x.options());
    const float* in = x.data_ptr<float>();
    uint8_t* packed = e.data.data_ptr<uint8_t>();
    float* scales = e.scales.data_ptr<float>();
    at::parallel_for(0, groups, grain(group), [&](int64_t first, int64_t end) {
      const int64_t step = cached_groups(group);
      const std::unique_ptr<int8_t[]> q(new int8_t[static_cast<size_t>(std::min(step, end - first) * group)]);
      for (int64_t g = first; g < end; g += step) {
        const int64_t count = std::min(step, end - g);
        quantize_groups_cpu(in + g * group, count, group, top, q.get(), scales + g);
        pack_nibbles_cpu(q.get(), count * group / 2, packed + g * group / 2);
      }
    });
    return e;
  }
  if (x.is_cpu() && !fp8) {
    const int64_t groups = x.size(0), group = x.size(1);
    e.data = at::empty(x.sizes(), x.options().dtype(at::kChar));
    e.scales = at::empty({groups, 1}, x.options());
    const float* in = x.data_ptr<float>();
    int8_t* q = e.data.data_ptr<int8_t>();
    float* scales = e.scales.data_ptr<float>();
    at::parallel_for(0, groups, grain(group), [&](int64_t first, int64_t end) {
      quantize_groups_cpu(in + first * group, end - first, group, top, q + first * group, scales + first);
    });
  } else {
    at::Tensor amax = x.abs().amax({1}, true);
    e.scales = at::where(amax > 0, amax / (fp8 ? 448.0 : top), at::ones_like(amax));
    at::Tensor scaled = x / e.scales;
    e.data = fp8 ? scaled.to(at::kFloat8_e4m3fn) : scaled.round().clamp(-top, top).to(at::kChar);
  }
  if (int4) e.data = pack_nibbles(e.data);
  return e;
}

at::Tensor dequantize(const EncodedTensor& e) {
  const bool int4 = e.form == EncodedTensor::Form::int4;
  if (int4 && e.data.is_cpu()) {
    const int64_t groups = e.scales.size(0), group = c10::multiply_integers(e.sizes) / groups;
    if (group % 2 == 0) {  // each group whole bytes, as quantize packed it
      at::Tensor out = at::empty(e.sizes, e.scales.options());
      const uint8_t* packed = e.data.data_ptr<uint8_t>();
      const float* scales = e.scales.data_ptr<float>();
      float* o = out.data_ptr<float>();
      at::parallel_for(0, groups, grain(group), [&](int64_t first, int64_t end) {
        const int64_t step = cached_groups(group);
        const std::unique_ptr<int8_t[]> q(new int8_t[static_cast<size_t>(std::min(step, end - first) * group)]);
        for (int64_t g = first; g < end; g += step) {
          const int64_t count = std::min(step, end - g);
          unpack_nibbles_cpu(packed + g * group / 2, count * group / 2, q.get());
          dequantize_int8_cpu(q.get(), scales + g, count, group, o + g * group);
        }
      });
      return out.to(e.dtype);
    }
  }
  const at::Tensor codes = int4 ? unpack_nibbles(e) : e.data;
#ifdef TESSERA_WITH_CUDA
  if (const auto dtype = codec_dtype(e.dtype);
      e.data.is_cuda() && dtype && !int4 && e.data.is_contiguous() && e.scales.is_contiguous()) {
    const c10::cuda::CUDAGuard guard(e.data.device());
    at::Tensor out = at::empty(e.sizes, e.data.options().dtype(e.dtype));
    kernels::dequantize_groups(e.data.data_ptr(), e.scales.data_ptr<float>(), e.form == EncodedTensor::Form::fp8,
                               e.data.size(0), e.data.size(1), out.data_ptr(), *dtype,
                               at::cuda::getCurrentCUDAStream().stream());
    return out;
  }
#endif
  if (!codes.is_cpu() || e.form == EncodedTensor::Form::fp8)
    return (codes.to(at::kFloat) * e.scales).to(e.dtype).view(e.sizes);
  const int64_t groups = codes.size(0), group = codes.size(1);
  at::Tensor out = at::empty(e.sizes, codes.options().dtype(at::kFloat));
  const int8_t* q = codes.data_ptr<int8_t>();
  const float* scales = e.scales.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, groups, grain(group), [&](int64_t first, int64_t end) {
    dequantize_int8_cpu(q + first * group, scales + first, end - first, group, o + first * group);
  });
  return out.to(e.dtype);
}

}  // namespace

ActivationCodec parse_activation_codec(const std::string& name) {
  if (name == "none") return ActivationCodec::none;
  if (name == "lossless") return ActivationCodec::lossless;
  if (name == "bf16") return ActivationCodec::bf16;
  if (name == "fp8") return ActivationCodec::fp8;
  if (name == "int8") return ActivationCodec::int8;
  if (name == "int4") return ActivationCodec::int4;
  fail("memory.activation_compression must be none, lossless, bf16, fp8, int8 or int4 (got '", name, "')");
}

std::vector<ActivationCodec> parse_activation_codecs(const std::string& list) {
  std::vector<ActivationCodec> out;
  if (list == "none") return out;
  if (list == "adaptive") return {ActivationCodec::int8, ActivationCodec::int4};
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const ActivationCodec codec = parse_activation_codec(list.substr(begin, end - begin));
    require(codec != ActivationCodec::none && std::find(out.begin(), out.end(), codec) == out.end(),
            "memory.activation_compression = '", list, "': a list of codecs names each once and not none");
    out.push_back(codec);
    begin = end + 1;
  }
  return out;
}

std::optional<ActivationCodec> parse_attention_codec(const std::string& name) {
  if (name == "same") return std::nullopt;
  return parse_activation_codec(name);
}

const char* activation_codec_name(ActivationCodec codec) {
  switch (codec) {
    case ActivationCodec::none: return "none";
    case ActivationCodec::lossless: return "lossless";
    case ActivationCodec::bf16: return "bf16";
    case ActivationCodec::fp8: return "fp8";
    case ActivationCodec::int8: return "int8";
    case ActivationCodec::int4: return "int4";
  }
  return "?";
}

double activation_codec_bytes_per_element(ActivationCodec codec, int64_t element_bytes) {
  switch (codec) {
    case ActivationCodec::bf16: return element_bytes == 4 ? 2.0 : static_cast<double>(element_bytes);
    case ActivationCodec::fp8:
    case ActivationCodec::int8: return 1.0 + 4.0 / static_cast<double>(kActivationGroup);
    case ActivationCodec::int4: return 0.5 + 4.0 / static_cast<double>(kActivationGroup);
    default: return static_cast<double>(element_bytes);
  }
}

int64_t EncodedTensor::bytes() const {
  const int64_t data_bytes = data.defined() ? data.numel() * static_cast<int64_t>(data.element_size()) : 0;
  return data_bytes + (scales.defined() ? scales.numel() * static_cast<int64_t>(scales.element_size()) : 0);
}

bool lossy_encoding_applies(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) && t.dim() >= 1 && t.size(-1) >= 8;
}

EncodedTensor encode_activation(const at::Tensor& t, ActivationCodec codec) {
  auto kept = [&] {
    EncodedTensor e;
    e.data = t;
    e.sizes = t.sizes().vec();
    e.dtype = t.scalar_type();
    return e;
  };
  if (codec == ActivationCodec::none || t.numel() == 0) return kept();
  if (t.scalar_type() == at::kBool) return pack_bits(t);
  if (!lossy_encoding_applies(t)) return kept();
  switch (codec) {
    case ActivationCodec::bf16: {
      if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) return kept();
      EncodedTensor e = kept();
      e.form = EncodedTensor::Form::bf16;
      e.data = t.to(at::kBFloat16).contiguous();
      return e;
    }
    case ActivationCodec::fp8: return quantize(t, EncodedTensor::Form::fp8);
    case ActivationCodec::int8: return quantize(t, EncodedTensor::Form::int8);
    case ActivationCodec::int4: return quantize(t, EncodedTensor::Form::int4);
    default: return kept();
  }
}

at::Tensor decode_activation(const EncodedTensor& e) {
  switch (e.form) {
    case EncodedTensor::Form::kept: return e.data;
    case EncodedTensor::Form::bits: return unpack_bits(e);
    case EncodedTensor::Form::bf16: return e.data.to(e.dtype);
    case EncodedTensor::Form::fp8:
    case EncodedTensor::Form::int8:
    case EncodedTensor::Form::int4: return dequantize(e);
  }
  return {};
}

}  // namespace tessera
