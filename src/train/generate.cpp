#include "train/generate.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "core/error.h"

namespace tessera {

std::vector<int64_t> generate_tokens(TransformerLMImpl& model, const std::vector<int64_t>& prompt,
                                     const SamplingOptions& options, const std::function<void(int64_t)>& on_token) {
  require(!prompt.empty(), "generate: the prompt encodes to no tokens");
  require(options.temperature >= 0, "generate: --temperature must be >= 0");
  require(options.top_k >= 0, "generate: --top-k must be >= 0");
  torch::NoGradGuard no_grad;
  model.eval();
  auto device = model.parameters().front().device();
  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  std::vector<int64_t> context = prompt, produced;
  const int64_t block = model.options().block_size;
  const int64_t vocab = options.vocab > 0 ? std::min(options.vocab, model.options().vocab_size) : model.options().vocab_size;
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - block);
    at::Tensor idx = at::tensor(std::vector<int64_t>(context.begin() + begin, context.end())).unsqueeze(0).to(device);
    // The padded rows of the vocabulary (model_options.h), and ids the tokenizer cannot decode,
    // are never sampled.
    at::Tensor logits = model.forward(idx, {}).logits.select(1, -1).squeeze(0).narrow(0, 0, vocab).to(at::kCPU, at::kFloat);
    int64_t next;
    if (options.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        at::Tensor kth = std::get<0>(logits.topk(options.top_k)).select(0, -1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = at::multinomial(logits.softmax(0), 1, false, generator).item<int64_t>();
    }
    context.push_back(next);
    produced.push_back(next);
    if (on_token) on_token(next);
  }
  return produced;
}

}  // namespace tessera
