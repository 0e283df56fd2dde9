// RMSNorm (rms_norm.h).
#include "model/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/autograd.h>

#include "core/vector_kernel.h"

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per block of the weight's gradient: each block's partial sum is made in row order, and the
// partials are added in block order, whatever the threads.
constexpr int64_t kRowsPerBlock = 64;

// Where each row of x [..., C] (last dimension contiguous, any other strides) starts; none for a
// contiguous x, whose row r starts at r C (the kernels take a null table so).
std::vector<int64_t> row_offsets(const at::Tensor& x) {
  if (x.is_contiguous()) return {};
  const int64_t rows = x.numel() / std::max<int64_t>(x.size(-1), 1), outer = x.dim() - 1;
  std::vector<int64_t> offsets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rest = r, offset = 0;
    for (int64_t d = outer - 1; d >= 0; --d) {
      offset += (rest % x.size(d)) * x.stride(d);
      rest /= x.size(d);
    }
    offsets[static_cast<size_t>(r)] = offset;
  }
  return offsets;
}

// sum of a[i] * b[i] * c[i] over n, in 16 lanes (each a product rounded, then added to its lane),
// the lanes added pairwise, then the tail: an order GCC can vectorise without reassociating.
__attribute__((always_inline)) inline float sum_of_products(const float* a, const float* b, const float* c,
                                                            int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[i + l] * b[i + l] * c[i + l];
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  float sum = lanes[0];
  for (; i < n; ++i) sum += a[i] * b[i] * c[i];
  return sum;
}

// Rows [first, end) forward: rstd of each row, y = x * rstd * w (rounded in that order, as ATen's
// two products). y and rstd contiguous; w [C] (ones where the norm has no weight).
TESSERA_VECTOR_KERNEL
void forward_rows(const float* x, const int64_t* offsets, const float* w, const float* ones, int64_t C, float eps,
                  int64_t first, int64_t end, float* y, float* rstd) {
  for (int64_t row = first; row < end; ++row) {
    const float* xr = x + (offsets ? offsets[row] : row * C);
    const float r = 1.0f / std::sqrt(sum_of_products(xr, xr, ones, C) / static_cast<float>(C) + eps);
    rstd[row] = r;
    float* yr = y + row * C;
    for (int64_t i = 0; i < C; ++i) yr[i] = xr[i] * r * w[i];
  }
}

// Rows [first, end) backward: dx of each row, and their sum of dy * x * rstd added to `dw_part`
// [C]. dy and dx contiguous.
TESSERA_VECTOR_KERNEL
void backward_rows(const float* x, const int64_t* offsets, const float* w, const float* dy, const float* rstd,
                   int64_t C, int64_t first, int64_t end, float* dx, float* dw_part) {
  for (int64_t row = first; row < end; ++row) {
    const float* xr = x + (offsets ? offsets[row] : row * C);
    const float* g = dy + row * C;
    const float r = rstd[row];
    const float c = r * r * r * (sum_of_products(g, w, xr, C) / static_cast<float>(C));
    float* d = dx + row * C;
    for (int64_t i = 0; i < C; ++i) d[i] = r * (g[i] * w[i]) - c * xr[i];
    for (int64_t i = 0; i < C; ++i) dw_part[i] += g[i] * (xr[i] * r);
  }
}

TESSERA_VECTOR_KERNEL
void add_rows(const float* parts, int64_t n, int64_t C, float* sum) {
  for (int64_t p = 0; p < n; ++p)
    for (int64_t i = 0; i < C; ++i) sum[i] += parts[p * C + i];
}

class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  // weight [C] contiguous (ones for a norm without one).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
    const at::Tensor ones = at::ones({C}, x.options());
    const std::vector<int64_t> offsets = row_offsets(x);
    at::Tensor y = at::empty(x.sizes(), x.options());
    std::vector<int64_t> stat_sizes = x.sizes().vec();
    stat_sizes.back() = 1;
    at::Tensor rstd = at::empty(stat_sizes, x.options());
    const float* xp = x.const_data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t first, int64_t end) {
      forward_rows(xp, offsets.empty() ? nullptr : offsets.data(), weight.const_data_ptr<float>(),
                   ones.const_data_ptr<float>(), C, static_cast<float>(eps), first, end, y.mutable_data_ptr<float>(),
                   rstd.mutable_data_ptr<float>());
    });
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor x = saved[0].stride(-1) == 1 ? saved[0] : saved[0].contiguous();
    const at::Tensor& w = saved[1];
    const at::Tensor rstd = saved[2].contiguous(), dy = grads[0].contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / std::max<int64_t>(C, 1);
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const std::vector<int64_t> offsets = row_offsets(x);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor parts = at::zeros({blocks, C}, x.options());
    at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t end) {
      for (int64_t b = first; b < end; ++b)
        backward_rows(x.const_data_ptr<float>(), offsets.empty() ? nullptr : offsets.data(), w.const_data_ptr<float>(),
                      dy.const_data_ptr<float>(), rstd.const_data_ptr<float>(), C, b * kRowsPerBlock,
                      std::min(rows, (b + 1) * kRowsPerBlock),
                      dx.mutable_data_ptr<float>(), parts.mutable_data_ptr<float>() + b * C);
    });
    at::Tensor dw;
    if (ctx->needs_input_grad(1)) {
      dw = at::zeros({C}, x.options());
      add_rows(parts.const_data_ptr<float>(), blocks, C, dw.mutable_data_ptr<float>());
    }
    return {dx, dw, at::Tensor()};
  }
};

bool fused_rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) > 0 &&
         x.stride(-1) == 1 &&
         (!weight.defined() || (weight.device().is_cpu() && weight.scalar_type() == at::kFloat &&
                                weight.dim() == 1 && weight.size(0) == x.size(-1)));
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fused_rms_norm_applies(x, weight))
    return RmsNorm::apply(x, weight.defined() ? weight.contiguous() : at::ones({x.size(-1)}, x.options()), eps);
  return rms_norm_aten(x, weight, eps);
}

at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, eps);
}

}  // namespace tessera
