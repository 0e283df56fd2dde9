// Autoregressive sampling from a trained model: temperature, top-k, a seed of its own (the
// global RNG is untouched). The context is cropped to the model's block_size.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/transformer.h"

namespace tessera {

struct SamplingOptions {
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 0;         // 0 = whole vocabulary
  uint64_t seed = 0;
  int64_t vocab = 0;         // sample only ids below this (the tokenizer's vocabulary); 0 = model.vocab_size
};

// Returns the new tokens; calls on_token for each as soon as it is drawn.
std::vector<int64_t> generate_tokens(TransformerLMImpl& model, const std::vector<int64_t>& prompt,
                                     const SamplingOptions& options,
                                     const std::function<void(int64_t)>& on_token = {});

}  // namespace tessera
