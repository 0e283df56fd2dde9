#include "train/device_peak.h"

#include <chrono>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace tessera {
namespace {

double measured_matmul_flops(const c10::Device& device, c10::ScalarType dtype) {
  const int64_t n = 1024;
  // A generator of its own: measuring must not advance the global RNG (resume equivalence).
  at::Generator generator = at::detail::createCPUGenerator(0);
  auto options = at::TensorOptions().dtype(dtype);
  at::Tensor a = at::randn({n, n}, generator, options.dtype(at::kFloat)).to(device, dtype);
  at::Tensor b = at::randn({n, n}, generator, options.dtype(at::kFloat)).to(device, dtype);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    auto start = std::chrono::steady_clock::now();
    at::Tensor c = at::mm(a, b);
    (void)c.sum().item<double>();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / seconds);  // first run warms up
  }
  return best;
}

#ifdef TESSERA_WITH_CUDA
// Dense tensor-core peaks (bf16/fp16; fp32 counts TF32) from the vendors' data sheets.
double published_gpu_peak(const std::string& name, c10::ScalarType dtype, std::string& basis) {
  struct Card {
    const char* match;
    double half_tflops;
    double fp32_tflops;
  };
  const Card cards[] = {{"H200", 989, 494}, {"H100", 989, 494}, {"A100", 312, 156}, {"L40", 181, 90},
                        {"4090", 165, 82},  {"3090", 71, 35},   {"A10", 125, 62}};
  for (const auto& card : cards)
    if (name.find(card.match) != std::string::npos) {
      bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
      basis = std::string("published peak (") + card.match + (half ? " 16-bit" : " tf32") + " dense)";
      return (half ? card.half_tflops : card.fp32_tflops) * 1e12;
    }
  return 0;
}
#endif

}  // namespace

DevicePeak device_peak(const c10::Device& device, c10::ScalarType dtype, double configured_tflops) {
  if (configured_tflops > 0) return {configured_tflops * 1e12, "train.peak_tflops"};
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) {
    std::string basis;
    double peak = published_gpu_peak(at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->name, dtype, basis);
    if (peak > 0) return {peak, basis};
  }
#endif
  return {measured_matmul_flops(device, dtype), "measured 1024^3 matmul"};
}

}  // namespace tessera
