// `tessera prepare`: text files -> a data directory (docs/data.md).
//
//   out_dir/train.bin   the first (1 - val_fraction) of the tokens, llm.c format
//   out_dir/val.bin     the last val_fraction of the tokens (the tail of the concatenated text)
//   out_dir/tokenizer.json (+ encoder.json, vocab.bpe for gpt2; for hf:DIR a copy of DIR's, or, for
//                       SentencePiece, tessera's naming the tokenizer.model copied beside it)
//
// Every file goes through a temporary name and rename(2), and tokenizer.json is written last, so an
// interrupted prepare leaves no half file and no directory that looks complete but is not.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "data/token_stream.h"

namespace tessera {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, concatenated in this order
  std::string out_dir;
  std::string tokenizer = "byte";   // "byte", "gpt2" or "hf:DIR" (data/hf_tokenizer.h)
  std::string encoder_json, vocab_bpe;  // gpt2 only
  double val_fraction = 0.05;       // in (0, 1); both splits must get at least one token
};

struct PrepareReport {
  int64_t train_tokens = 0, val_tokens = 0, vocab_size = 0;
  double unigram_entropy_nats = 0;  // of the train split: the loss of the best context-free model
};

PrepareReport prepare_data(const PrepareOptions& options, std::ostream& log);

// Entropy of the stream's token frequencies, -sum p ln p, in nats per token: the cross-entropy that
// a model ignoring context cannot beat, the baseline training must get below.
double unigram_entropy(const TokenStream& data);

}  // namespace tessera
