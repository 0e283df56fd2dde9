// The encodings of a saved activation (memory.activation_compression; docs/memory.md).
//
//   none      kept as it is.
//   lossless  bool tensors (dropout and comparison masks) packed 8 to a byte; every other tensor
//             kept. Decoding gives the same bits back.
//   bf16      float32 tensors rounded to bfloat16 (round to nearest even); 16-bit ones kept.
//   fp8       each group of 32 consecutive elements along the last dimension scaled by its
//             largest magnitude to 448 and rounded to float8 e4m3; one float32 scale per group.
//   int8      each group of 32 along the last dimension scaled by its largest magnitude to 127 and
//             rounded to the nearest integer (ties to even); one float32 scale per group.
//   int4      each group of 32 scaled by its largest magnitude to 7 and rounded as int8's (ActNN's and
//             GACT's 4-bit activations, with int8's grouping); two to a byte (element 2 i in the low
//             four bits, 2 i + 1 in the high, each stored plus 8), one float32 scale per group.
//   The lossy encodings pack bool tensors as lossless does.
//
// The group: 32 consecutive elements of the last dimension when 32 divides it, else the whole last
// dimension. A group depends only on the values in it, so a layout that splits a tensor between
// ranks along an outer dimension (data, sequence, pipeline parallelism, heads under tensor
// parallelism) or along the last one at multiples of 32 encodes each element exactly as one
// process does: the layouts' gradients then differ only by their own rounding.
//
// Encoding and decoding run on the tensor's device (CPU kernels, CUDA kernels for int8 and fp8, ATen
// expressions elsewhere): no copy through the host, no synchronisation. Decoding gives a contiguous tensor of the
// original sizes and dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

enum class ActivationCodec { none, lossless, bf16, fp8, int8, int4 };

// Parses memory.activation_compression; throws tessera::Error naming the key and the values.
ActivationCodec parse_activation_codec(const std::string& name);
// Under memory.activation_policy = auto memory.activation_compression may list several codecs,
// comma-separated ("bf16,int8"): the encodings a block may choose. The codecs it names, in its
// order ("none": none; "adaptive": int8 and int4, the encodings each tensor may get,
// adaptive_codecs.h); refuses a list naming none or one codec twice, naming the key.
std::vector<ActivationCodec> parse_activation_codecs(const std::string& list);
const char* activation_codec_name(ActivationCodec codec);
// Parses memory.attention_compression: unset for "same" (the block's codec), else the codec named.
std::optional<ActivationCodec> parse_attention_codec(const std::string& name);

constexpr int64_t kActivationGroup = 32;

// Bytes an encoded element of an activation of `element_bytes` bytes holds (bool masks and the
// tensors a codec keeps aside): none and lossless keep it, bf16 halves float32, fp8 and int8 hold
// a byte and a float32 scale per group, int4 half a byte and the scale.
double activation_codec_bytes_per_element(ActivationCodec codec, int64_t element_bytes);

// A tensor as saved: either the tensor itself (`kept`) or its encoding.
struct EncodedTensor {
  enum class Form { kept, bits, bf16, fp8, int8, int4 };
  Form form = Form::kept;
  at::Tensor data;    // kept: the tensor; bits: uint8 [ceil(n / 8)]; bf16; fp8/int8: [groups, group];
                      // int4: uint8 [ceil(n / 2)]
  at::Tensor scales;  // fp8/int8/int4: float32 [groups, 1]
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;

  // The bytes this encoding holds (for `kept`, the tensor's own elements).
  int64_t bytes() const;
};

// How `codec` encodes `t` when it is an activation. Lossy formats apply to floating tensors whose
// last dimension is at least 8 (a norm's per-row statistics [.., 1] are kept); no test depends on
// the tensor's whole size, which a layout changes.
EncodedTensor encode_activation(const at::Tensor& t, ActivationCodec codec);
// Whether the lossy codecs encode `t` (a floating tensor whose last dimension is at least 8);
// they keep any other as it is.
bool lossy_encoding_applies(const at::Tensor& t);
at::Tensor decode_activation(const EncodedTensor& e);

}  // namespace tessera
