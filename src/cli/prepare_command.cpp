// `tessera prepare`: turns text files into the token files `data.path` reads.
#include <iostream>

#include "cli/commands.h"
#include "data/prepare.h"

namespace tessera::cli {

Command add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<PrepareOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "tokenize text files into train/validation token files");
  cmd->add_option("--input", options->inputs, "text files to read (concatenated in order)")->required()->take_all();
  cmd->add_option("--out", options->out_dir, "data directory to write (train.bin, val.bin, tokenizer.json)")->required();
  cmd->add_option("--tokenizer", options->tokenizer,
                  "byte, gpt2, or hf:DIR (a Hugging Face folder's tokenizer.json or SentencePiece tokenizer.model)")
      ->check([](const std::string& value) {
        return value == "byte" || value == "gpt2" || (value.rfind("hf:", 0) == 0 && value.size() > 3)
                   ? std::string()
                   : "must be byte, gpt2 or hf:DIR (got '" + value + "')";
      })
      ->capture_default_str();
  cmd->add_option("--encoder", options->encoder_json, "GPT-2 encoder.json (with --tokenizer gpt2)");
  cmd->add_option("--merges", options->vocab_bpe, "GPT-2 vocab.bpe merges file (with --tokenizer gpt2)");
  cmd->add_option("--val-fraction", options->val_fraction, "fraction of tokens held out for validation (the tail)")
      ->capture_default_str();
  return [options]() {
    prepare_data(*options, std::cout);
    return 0;
  };
}

}  // namespace tessera::cli
