// SwiGLU's gate as one autograd function: swiglu(h) = u * silu(g), h = [u | g] the joined up and
// gate projection (last dimension 2H; model/mlp.h, the SwiGLU experts of model/moe.h).
//
// Composed from ATen ops, autograd keeps three tensors for its backward (u and g, views of h, and
// silu(g)) and ends it with the concatenation of u's and g's gradients. This function keeps h
// alone (the product, the down projection's input, is kept there) and writes both gradients into
// the joined one:
//   du = dy * silu(g)
//   dg = dy * u * s * (1 + g (1 - s)),  s = sigmoid(g)     (at::silu_backward of dy * u)
// Measured (tessera bench --json with bench/compare_pytorch.py's tiny_llama settings, CPU float32,
// this build and the one before alternating six times): saved activations 91.0 to 79.5 MB a step
// (-12.7%), the peak of tensor bytes 112.2 to 101.3 MB (-9.8%), the median step 0.0864 to 0.0871 s
// (+0.8%, within the runs' spread). The forward and both gradients are ATen's vectorized ops, on
// any device; one fused kernel each way: not built. A hand-written CPU loop was slower (scalar
// exp: the step 13% slower): not kept (docs/models.md).
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

// h [..., 2H] -> [..., H]: h[..., :H] * silu(h[..., H:]).
at::Tensor swiglu(const at::Tensor& h);

}  // namespace tessera
