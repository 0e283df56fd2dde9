// The small model the model-level tests build from options: 2 blocks, 2 heads, a 50-token
// vocabulary, a 32-token context, lightning chunks of 8, top-2 routing where the feed-forward is
// MoE; width and dropout as each test needs them.
#pragma once

#include <string>

#include "model/model_options.h"

namespace tessera::test {

inline ModelOptions small_model(const std::string& arch, const std::string& ffn, int64_t n_embd, double dropout) {
  ModelOptions o;
  o.arch = arch;
  o.ffn = ffn;
  o.vocab_size = 50;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = n_embd;
  o.block_size = 32;
  o.linear_chunk = 8;
  o.dropout = dropout;
  o.moe_top_k = 2;
  return o;
}

}  // namespace tessera::test
