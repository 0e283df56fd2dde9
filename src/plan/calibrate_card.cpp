// The first CUDA device measured as a one-node cluster file (calibrate.h, calibrate_this_card).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "core/error.h"
#include "plan/calibrate.h"
#include "plan/calibrate_timing.h"

namespace tessera::plan {
#ifdef TESSERA_WITH_CUDA
namespace {

const c10::Device kCard(c10::DeviceType::CUDA, 0);

// Runs `op` and waits for the device.
std::function<void()> synced(std::function<void()> op) {
  return [op = std::move(op)] {
    op();
    torch::cuda::synchronize();
  };
}

// The device's median time of each of `ops`: each op queued back to back enough times to fill
// about 2 ms, then one synchronization, so that a point's time is the kernels' as a step queues
// them (one synchronization per launch would add its latency, tens of microseconds, to products
// that take a hundred), divided by the repetitions.
std::vector<double> device_medians(const std::vector<std::function<void()>>& ops, double budget) {
  std::vector<std::function<void()>> batches;
  std::vector<int> reps;
  for (const std::function<void()>& op : ops) {
    synced(op)();
    const calibration::Clock::time_point start = calibration::Clock::now();
    synced(op)();
    const double once = calibration::seconds_since(start);
    const int n = static_cast<int>(std::clamp(std::ceil(2e-3 / std::max(once, 1e-7)), 1.0, 200.0));
    reps.push_back(n);
    batches.push_back(synced([op, n] {
      for (int i = 0; i < n; ++i) op();
    }));
  }
  std::vector<double> seconds = calibration::medians_in_rounds(batches, budget);
  for (size_t i = 0; i < seconds.size(); ++i) seconds[i] /= reps[i];
  return seconds;
}

struct Fit {
  double rate = 0;          // per second (FLOP/s or bytes/s)
  double intercept_s = 0;   // the fit's fixed time per call
};

Fit fit(const std::vector<double>& work, const std::vector<double>& seconds, const char* what) {
  const auto [intercept, per_unit] = calibration::fit_line(work, seconds);
  require(per_unit > 0, "tessera plan calibrate: the ", what, " times did not grow with their size");
  return {1 / per_unit, std::max(0.0, intercept)};
}

// Each axis of the bf16 product grid: the widths of GPT-2 and Llama-family blocks (768 to 8192)
// and the rows of their micro-batches (up to 32768 tokens); a product outside it is priced at the
// nearest edge (plan/matmul_table.h).
const std::vector<int64_t> kAxis = {768, 2048, 3072, 8192, 16384, 32768};

// bf16 products [rows, depth] x [depth, cols] over the full grid, each point's median over three
// rounds; the operands are views of three buffers sized for the largest. Returns the CSV text and
// the fit of every point (time = overhead + FLOPs / rate).
std::pair<std::string, Fit> matmul_table(double budget) {
  const int64_t largest = kAxis.back() * kAxis.back();
  const auto options = at::TensorOptions().device(kCard).dtype(at::kBFloat16);
  const at::Tensor a = at::randn({largest}, options), b = at::randn({largest}, options);
  at::Tensor c = at::empty({largest}, options);
  struct Point {
    int64_t rows, cols, depth;
  };
  std::vector<Point> points;
  std::vector<std::function<void()>> ops;
  std::vector<double> flops;
  for (int64_t rows : kAxis)
    for (int64_t cols : kAxis)
      for (int64_t depth : kAxis) {
        points.push_back({rows, cols, depth});
        const at::Tensor x = a.narrow(0, 0, rows * depth).view({rows, depth});
        const at::Tensor w = b.narrow(0, 0, depth * cols).view({depth, cols});
        at::Tensor out = c.narrow(0, 0, rows * cols).view({rows, cols});
        ops.push_back([x, w, out]() mutable { at::mm_out(out, x, w); });
        flops.push_back(2.0 * static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(depth));
      }
  const std::vector<double> seconds = device_medians(ops, budget);
  std::string csv = "rows,cols,depth,tflops_bf16\n";
  for (size_t i = 0; i < points.size(); ++i) {
    char line[96];
    std::snprintf(line, sizeof line, "%lld,%lld,%lld,%.1f\n", static_cast<long long>(points[i].rows),
                  static_cast<long long>(points[i].cols), static_cast<long long>(points[i].depth),
                  flops[i] / seconds[i] / 1e12);
    csv += line;
  }
  return {csv, fit(flops, seconds, "bf16 products'")};
}

// float32 products (TF32 as the run configures it) at four square and two flat shapes, fitted.
Fit fp32_products(double budget) {
  std::vector<std::function<void()>> ops;
  std::vector<double> flops;
  const int64_t shapes[][3] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192},
                               {8192, 3072, 768},  {16384, 768, 3072}, {6144, 6144, 6144}};
  for (const auto& s : shapes) {
    const auto options = at::TensorOptions().device(kCard).dtype(at::kFloat);
    const at::Tensor x = at::randn({s[0], s[2]}, options), w = at::randn({s[2], s[1]}, options);
    at::Tensor out = at::empty({s[0], s[1]}, options);
    ops.push_back([x, w, out]() mutable { at::mm_out(out, x, w); });
    flops.push_back(2.0 * static_cast<double>(s[0] * s[1] * s[2]));
  }
  return fit(flops, device_medians(ops, budget), "float32 products'");
}

// Causal attention through SDPA (cuDNN's or flash kernels), bf16, forward and backward, at five
// shapes of GPT-2 and Llama-family blocks; FLOPs counted as the planner counts them
// (model/operations.h: 2 b h s^2 d forward, the backward 2.5x).
Fit attention(double budget) {
  struct Shape {
    int64_t b, h, s, d;
  };
  std::vector<std::function<void()>> ops;
  std::vector<double> flops;
  for (const Shape& x : {Shape{8, 12, 1024, 64}, Shape{16, 12, 1024, 64}, Shape{4, 32, 2048, 64},
                         Shape{2, 32, 4096, 64}, Shape{4, 16, 2048, 128}}) {
    const auto options = at::TensorOptions().device(kCard).dtype(at::kBFloat16);
    const at::Tensor q = at::randn({x.b, x.h, x.s, x.d}, options).set_requires_grad(true);
    const at::Tensor k = at::randn({x.b, x.h, x.s, x.d}, options).set_requires_grad(true);
    const at::Tensor v = at::randn({x.b, x.h, x.s, x.d}, options).set_requires_grad(true);
    const at::Tensor grad = at::ones({x.b, x.h, x.s, x.d}, options);
    ops.push_back([q, k, v, grad] {
      at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true).backward(grad);
    });
    flops.push_back(3.5 * 2.0 * static_cast<double>(x.b * x.h * x.s * x.s * x.d));
  }
  return fit(flops, device_medians(ops, budget), "attention");
}

// LayerNorm then GELU on bf16 tensors of width 768, forward and backward through autograd, at four
// sizes large enough (50M to 400M elements) that the kernels, not their launches, set the time; bytes counted as the planner counts them (each reads and writes its tensor, the backward
// twice that: 12 bytes per bf16 element each), fitted.
Fit memory_kernels(double budget) {
  std::vector<std::function<void()>> ops;
  std::vector<double> bytes;
  const int64_t width = 768;
  for (int64_t rows : {65536, 131072, 262144, 524288}) {
    const auto options = at::TensorOptions().device(kCard).dtype(at::kBFloat16);
    const at::Tensor x = at::randn({rows, width}, options).set_requires_grad(true);
    const at::Tensor weight = at::ones({width}, options).set_requires_grad(true);
    const at::Tensor bias = at::zeros({width}, options).set_requires_grad(true);
    ops.push_back([x, weight, bias] { at::gelu(at::layer_norm(x, {width}, weight, bias)).sum().backward(); });
    bytes.push_back(24.0 * static_cast<double>(rows * width));
  }
  return fit(bytes, device_medians(ops, budget), "memory-bound kernels'");
}

// Copies between pinned host memory and the card, 16 to 512 MiB each way, fitted; the slower way.
double host_link_gbs(double budget) {
  double slowest = 0;
  for (const bool to_device : {true, false}) {
    std::vector<std::function<void()>> ops;
    std::vector<double> bytes;
    for (int64_t mib : {16, 64, 256, 512}) {
      const int64_t n = mib << 20;
      const at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      const at::Tensor device = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(kCard));
      ops.push_back([host, device, to_device] {
        if (to_device) device.copy_(host, /*non_blocking=*/true);
        else host.copy_(device, /*non_blocking=*/true);
      });
      bytes.push_back(static_cast<double>(n));
    }
    const double gbs = fit(bytes, device_medians(ops, budget), "host copies'").rate / 1e9;
    slowest = slowest == 0 ? gbs : std::min(slowest, gbs);
  }
  return slowest;
}

}  // namespace
#endif

std::string calibrate_this_card(const CalibrateOptions& options, const CardPeaks& peaks, const std::string& table_path,
                                const std::string& table_name, const std::function<void(const std::string&)>& progress) {
#ifndef TESSERA_WITH_CUDA
  (void)options, (void)peaks, (void)table_path, (void)table_name, (void)progress;
  fail("tessera plan calibrate --device cuda: this build has no CUDA (configure with -DTESSERA_CUDA=ON)");
#else
  require(torch::cuda::is_available(), "tessera plan calibrate --device cuda: no CUDA device is usable here");
  const double budget = options.seconds_per_point;
  const cudaDeviceProp* card = at::cuda::getDeviceProperties(0);
  const std::string name = card->name;
  const double card_gib = static_cast<double>(card->totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);

  progress("bf16 products over a grid of " + std::to_string(kAxis.size() * kAxis.size() * kAxis.size()) + " shapes");
  const auto [table, bf16] = matmul_table(budget / 4);
  {
    std::ofstream out(table_path);
    require(static_cast<bool>(out), "tessera plan calibrate: cannot write ", table_path);
    out << "# bf16 products [rows, depth] x [depth, cols] on " << name << ", measured by `tessera plan calibrate --device "
        << "cuda`: each point the median of its runs over three rounds (cuBLAS through at::mm).\n"
        << table;
  }
  progress("float32 products at 6 shapes");
  const Fit fp32 = fp32_products(budget);
  progress("causal attention (SDPA), bf16, forward and backward, at 5 shapes");
  const Fit sdpa = attention(budget);
  progress("memory-bound kernels (LayerNorm, GELU), bf16, at 4 sizes, and kernel overhead");
  const Fit memory = memory_kernels(budget);
  // A step's small kernels run through autograd, one synchronization a run.
  const double overhead_us = calibration::autograd_kernel_us(kCard, budget, [] { torch::cuda::synchronize(); });
  progress("the activation codecs (int8, int4, fp8, bf16), encoding and decoding 32 MiB");
  const auto card_sync = [] { torch::cuda::synchronize(); };
  const double codec_int8 = calibration::activation_codec_gbs("int8", kCard, budget, card_sync);
  const double codec_int4 = calibration::activation_codec_gbs("int4", kCard, budget, card_sync);
  const double codec_fp8 = calibration::activation_codec_gbs("fp8", kCard, budget, card_sync);
  const double codec_bf16 = calibration::activation_codec_gbs("bf16", kCard, budget, card_sync);
  progress("pinned host copies each way, 16 to 512 MiB");
  const double link_gbs = host_link_gbs(budget);
  progress("the optimizer step (AdamW) on the host, " + std::to_string(at::get_num_threads()) + " threads");
  const double optimizer_gbs = calibration::adamw_host_gbs(64 << 20, budget);

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  char text[8192];
  std::snprintf(
      text, sizeof text,
      "# measured by `tessera plan calibrate --device cuda` on one %s, %s\n"
      "[cluster]\n"
      "description = \"one %s (calibrated)\"\n"
      "devices_per_node = 1\n"
      "nodes = 1\n\n"
      "[device]\n"
      "name = \"%s\"\n"
      "kind = \"cuda\"\n"
      "peak_tflops_bf16 = %.1f     # %s\n"
      "peak_tflops_fp32 = %.1f     # %s\n"
      "matmul_tflops_bf16 = %.1f   # the product grid in %s (%zu points), fitted: time = overhead + FLOPs / rate\n"
      "matmul_table = \"%s\"\n"
      "matmul_tflops_fp32 = %.1f   # float32 products at 6 shapes, fitted\n"
      "matmul_overhead_us = %.2f    # the bf16 fit's intercept less kernel_overhead_us\n"
      "attention_tflops_bf16 = %.1f  # causal SDPA forward + backward at 5 shapes (head width 64 and 128), counted as the planner counts it, fitted\n"
      "memory_gib = %.1f           # the card's total memory\n"
      "memory_gbs = %.0f           # LayerNorm + GELU on bf16, forward and backward through autograd, at 4 sizes, bytes counted as the planner counts them, fitted\n"
      "kernel_overhead_us = %.2f     # 32 chained adds on 8 elements, forward and backward through autograd: median time / 64\n"
      "activation_codec_int8_gbs = %.1f  # int8 encoding and decoding of a [16384, 512] float32 activation: source bytes / median time\n"
      "activation_codec_int4_gbs = %.1f  # the same, int4\n"
      "activation_codec_fp8_gbs = %.1f   # the same, fp8\n"
      "activation_codec_bf16_gbs = %.1f  # the same, bf16\n\n"
      "[intra_node]\n"
      "bandwidth_gbs = %.1f        # not measured (one device): the pinned host link below, the path between two cards without peer access\n"
      "latency_us = 10\n\n"
      "[inter_node]\n"
      "bandwidth_gbs = %.1f        # not measured (one node): as intra_node\n"
      "latency_us = 10\n\n"
      "[host]\n"
      "memory_gib = %.1f            # MemTotal\n"
      "device_link_gbs = %.1f       # pinned copies 16 to 512 MiB each way, fitted: the slower way\n"
      "optimizer_gbs = %.1f         # AdamW's step over 64M float32 elements on %d threads, 28 bytes per element\n",
      name.c_str(), date, name.c_str(), name.c_str(), peaks.bf16_tflops, peaks.bf16_basis.c_str(), peaks.fp32_tflops,
      peaks.fp32_basis.c_str(), std::min(bf16.rate / 1e12, peaks.bf16_tflops), table_name.c_str(),
      kAxis.size() * kAxis.size() * kAxis.size(), table_name.c_str(), std::min(fp32.rate / 1e12, peaks.fp32_tflops),
      std::max(0.0, bf16.intercept_s * 1e6 - overhead_us), sdpa.rate / 1e12, card_gib, memory.rate / 1e9, overhead_us,
      codec_int8, codec_int4, codec_fp8, codec_bf16, link_gbs, link_gbs, calibration::host_memory_gib(), link_gbs, optimizer_gbs, at::get_num_threads());
  return text;
#endif
}

}  // namespace tessera::plan
