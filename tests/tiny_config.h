// The tiny transformer several layout tests share: 2 blocks of width 32 with 4 heads, a 64-token
// vocabulary, sequences of `seq_len` tokens in a context of `block_size` (default: the same), one
// intra-op thread. Each test sets what else it needs on the returned Config.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace tessera::test {

inline Config tiny_config(int64_t seq_len, int64_t block_size = 0) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.n_embd = 32;
  c.model.vocab_size = 64;
  c.model.block_size = block_size > 0 ? block_size : seq_len;
  c.train.seq_len = seq_len;
  c.train.threads = 1;
  return c;
}

}  // namespace tessera::test
