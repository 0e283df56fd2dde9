// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019) as PyTorch's DDP hook
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook computes it: one power iteration per
// step, warm start, error feedback, with min_compression_rate 1 and QR orthogonalisation.
//
// Per bucket b, its steps counted per bucket from 0 (N = group size, r = parallel.powersgd_rank):
//   step < start_step: plain all-reduce mean; nothing but the step count is kept.
//   otherwise, in float32, acc [bucket numel] = the gradients flattened + the residual, and each
//   gradient with dim >= 2 is viewed as M [n, m] = [size(0), numel / size(0)] with
//   r' = min(n, m, r). It is compressed when r' (n + m) < n m, i.e. when that saves bytes; the
//   others (vectors, tiny matrices) travel whole and are averaged exactly.
//     1. Q [m, r'] <- orthonormalise(Q). Warm start: Q is the previous step's. On the bucket's
//        first compressed step the Qs are one randn(sum m r') drawn from a CPU generator seeded
//        with b, so every rank starts from the same Q.
//     2. P [n, r'] = M Q.
//     3. All-reduce mean of (the uncompressed gradients, then each P), one message in bucket order.
//     4. P <- orthonormalise(P).
//     5. Q = M^T P; all-reduce mean of every Q, one message.
//     6. The gradient becomes M^ = P Q^T, and residual = M - M^ (zero where the gradient was sent
//        whole: its average is exact). Since P and Q are linear in M, the mean of the ranks'
//        residuals is mean(M) - M^.
//   orthonormalise is the Q factor of a reduced QR: orthonormal columns spanning the input even
//   when it is rank-deficient (a zero gradient gives no NaN).
//
// Bytes sent per rank per compressed step (ring all-reduce, float32):
//   2 (N-1)/N * 4 * (uncompressed numel + sum over compressed matrices of r' (n + m))
// against 2 (N-1)/N * 4 * bucket numel uncompressed.
//
// State per bucket: "powersgd.bucket<b>.step" int64 [] (steps taken), and from its first
// compressed step on "powersgd.bucket<b>.residual" float32 [bucket numel] and
// "powersgd.bucket<b>.q" float32 [sum m r'] (each compressed matrix's Q, [m, r'] row-major, in
// bucket order), residual and q present together or not at all.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/compression/compressor.h"

namespace tessera {

class PowerSGD : public GradientCompressor {
 public:
  PowerSGD(int64_t rank, int64_t start_step);

  void all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;

 private:
  struct Bucket {
    int64_t step = 0;
    at::Tensor residual, q;  // float32 on the gradients' device; undefined before compression starts
    std::string loaded_from;  // the checkpoint whose residual and q are still unchecked against the layout
  };
  void compress(std::vector<at::Tensor>& grads, int64_t index, Bucket& bucket, comm::Group& group);

  int64_t rank_;
  int64_t start_step_;
  std::map<int64_t, Bucket> buckets_;
};

}  // namespace tessera
