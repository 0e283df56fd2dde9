// Options of the data pipeline: the [data] section. A data directory is what `tessera prepare`
// writes: train.bin and val.bin (llm.c token files) and tokenizer.json (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include "core/options.h"

namespace tessera {

struct DataOptions {
  std::string path = "build/data/kjv";  // directory written by `tessera prepare`
  std::string train_file = "train.bin";
  std::string val_file = "val.bin";
  int64_t seed = 1234;  // seed of the training batch order (BatchSampler)

  template <class V>
  void visit(V& v) {
    v("path", path, "directory written by `tessera prepare` (train/val token files, tokenizer.json)");
    v("train_file", train_file, "training token file inside data.path (llm.c or raw uint16 format)");
    v("val_file", val_file, "validation token file inside data.path");
    v("seed", seed, "seed of the training batch order (independent of train.seed)", between(0, 9.2e18));
  }
  void check(const std::string& source) const;
};

}  // namespace tessera
