// The data a run trains and evaluates on, opened from its [data] section: the train and
// validation streams (token_stream.h: a file or a glob of shards inside data.path) and the
// tokenizer, when data.path has a tokenizer.json.
//
// Invariants, checked by open_training_data with the file or key named:
// - both streams exist and every token of both lies below model.vocab_size;
// - a tokenizer, when present, fits model.vocab_size. Without one (llm.c's data scripts write
//   token shards only) training runs all the same; the checkpoint then carries no tokenizer and
//   `tessera generate` asks for --tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/data_options.h"
#include "data/token_stream.h"
#include "data/tokenizer.h"

namespace tessera {

struct TrainingData {
  TokenStream train, val;
  std::unique_ptr<Tokenizer> tokenizer;  // null when data.path has no tokenizer.json

  // "DIR/train.bin: 1 shard, 975575 tokens; DIR/val.bin: ...; tokenizer byte (vocab 256)"
  std::string describe() const;
};

TrainingData open_training_data(const DataOptions& data, int64_t vocab_size);

}  // namespace tessera
