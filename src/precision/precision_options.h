// The [precision] section: the training dtype and the fp16 dynamic loss scale.
//
//   fp32  everything in float32.
//   bf16  float32 parameters, gradients and optimizer state; the forward runs under autocast
//         with bfloat16 (AutocastGuard); no loss scaling (bf16 has fp32's exponent range).
//   fp16  Megatron style: float16 model parameters and activations, float32 master weights that
//         the optimizer owns (MasterWeights), and a dynamic loss scale (DynamicLossScaler). A step
//         whose gradients overflow is skipped and the scale backs off; max_skipped_steps
//         consecutive skips stop the run (the scale has backed off by backoff^N: the model
//         overflows at any scale, and the loss is not going to become finite again).
//
// fp16 uses half parameters rather than autocast. Not for lack of coverage: measured on torch
// 2.11, CPU autocast with float16 casts linear, matmul, bmm and SDPA to half exactly as it does
// for bfloat16. The reasons are memory and the Megatron recipe: autocast keeps fp32 weights and
// gradients and re-casts weights per op, whereas half parameters halve parameter, gradient and
// activation memory, with fp32 masters carrying the precision the update needs. On the CPU fp16
// buys no speed either way (fp16 matmul runs at fp32 speed; docs/mixed_precision.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>
#include "core/options.h"

namespace tessera {

struct PrecisionOptions {
  std::string dtype = "fp32";
  double loss_scale_init = 65536;
  int64_t loss_scale_growth_interval = 2000;
  double loss_scale_growth = 2.0;
  double loss_scale_backoff = 0.5;
  int64_t max_skipped_steps = 50;

  template <class V>
  void visit(V& v) {
    v("dtype", dtype, "fp32, bf16 (autocast forward, fp32 weights) or fp16 (fp16 weights, fp32 masters, loss scaling)");
    v("loss_scale_init", loss_scale_init, "fp16: initial loss scale", above(0, 4294967296.0));
    v("loss_scale_growth_interval", loss_scale_growth_interval,
      "fp16: consecutive steps without overflow before the scale grows", between(1, 1e9));
    v("loss_scale_growth", loss_scale_growth, "fp16: factor the scale grows by", between(1, 1024));
    v("loss_scale_backoff", loss_scale_backoff, "fp16: factor the scale shrinks by on overflow", Range{0, 1, true, true});
    v("max_skipped_steps", max_skipped_steps, "fp16: consecutive overflow-skipped steps that stop the run",
      between(1, 1e6));
  }
  void check(const std::string& source) const;
};

// The dtype the forward runs under autocast: bf16 -> kBFloat16; fp32 and fp16 -> none (fp16
// converts the model's parameters to half instead; see above).
std::optional<at::ScalarType> autocast_dtype(const PrecisionOptions& options);

// The dtype of the model's parameters: kHalf for fp16, kFloat otherwise.
at::ScalarType parameter_dtype(const PrecisionOptions& options);

}  // namespace tessera
