// open_training_data (training_data.h).
#include "data/training_data.h"

#include <filesystem>

#include "core/error.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

std::string describe_stream(const TokenStream& s) {
  const size_t n = s.shards().size();
  return s.name() + ": " + std::to_string(n) + (n == 1 ? " shard, " : " shards, ") + std::to_string(s.size()) +
         " tokens";
}

}  // namespace

std::string TrainingData::describe() const {
  return describe_stream(train) + "; " + describe_stream(val) + "; " +
         (tokenizer ? "tokenizer " + tokenizer->type() + " (vocab " + std::to_string(tokenizer->vocab_size()) + ")"
                    : std::string("no tokenizer.json (generate will need --tokenizer)"));
}

TrainingData open_training_data(const DataOptions& data, int64_t vocab_size) {
  if (!fs::is_directory(data.path))
    fail("data.path = \"", data.path, "\": no such directory (create it with `tessera prepare --out ", data.path, "`)");
  std::unique_ptr<Tokenizer> tokenizer;
  if (fs::exists(fs::path(data.path) / "tokenizer.json")) {
    tokenizer = load_tokenizer(data.path);
    require(tokenizer->vocab_size() <= vocab_size, data.path, "/tokenizer.json: vocabulary of ",
            tokenizer->vocab_size(), " tokens does not fit model.vocab_size = ", vocab_size);
  }
  TrainingData out{TokenStream::open(data.path, data.train_file), TokenStream::open(data.path, data.val_file),
                   std::move(tokenizer)};
  for (const TokenStream* stream : {&out.train, &out.val})
    for (const TokenFile& shard : stream->shards())
      require(shard.vocab_bound() <= vocab_size, shard.path(), ": holds token id ", shard.vocab_bound() - 1,
              ", outside model.vocab_size = ", vocab_size);
  return out;
}

}  // namespace tessera
