// The denominator of model-FLOPs utilisation. GPUs: the card's published dense peak for the
// training dtype (a table of known cards). CPUs publish no usable figure, so the peak is measured:
// the best of a few large matmuls in the training dtype, on the threads the run uses. MFU on CPU
// therefore reads "fraction of this machine's achievable matmul rate".
#pragma once

#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace tessera {

struct DevicePeak {
  double flops = 0;   // per second
  std::string basis;  // "measured matmul", "published peak (H100 SXM bf16 dense)", "train.peak_tflops"
};

DevicePeak device_peak(const c10::Device& device, c10::ScalarType dtype, double configured_tflops);

}  // namespace tessera
