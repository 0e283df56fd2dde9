// `tessera generate`: samples text from a checkpoint, streaming tokens as they are drawn. The
// tokenizer is the checkpoint's own (copied from the data directory at save, or from the Hugging
// Face folder by `tessera import`), or --tokenizer DIR
// for a checkpoint trained on data without one (llm.c shards).
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "model/hf_names.h"
#include "model/transformer.h"
#include "config/config.h"
#include "train/generate.h"

namespace tessera::cli {

Command add_generate_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, tokenizer, prompt = "\n";
    SamplingOptions sampling;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("generate", "write text with a trained model");
  cmd->add_option("--checkpoint", args->checkpoint, "a step_N, checkpoints or run directory")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "directory holding the tokenizer.json to use (default: the checkpoint's own)");
  cmd->add_option("--prompt", args->prompt, "text to continue")->capture_default_str();
  cmd->add_option("--max-tokens", args->sampling.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", args->sampling.temperature, "softmax temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", args->sampling.top_k, "sample from the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--seed", args->sampling.seed, "random seed")->capture_default_str();
  return [args]() {
    LoadedCheckpoint ckpt = load_checkpoint(args->checkpoint, /*with_optimizer=*/false);
    Config config = Config::from_checkpoint_meta(ckpt.dir + "/meta.json", {});
    TransformerLM model(config.model);
    import_state(*model, ckpt.model, model_source(ckpt));
    const bool own = args->tokenizer.empty();
    require(!own || std::filesystem::exists(ckpt.dir + "/tokenizer.json") ||
                std::filesystem::exists(ckpt.dir + "/tokenizer.model"),
            ckpt.dir,
            " holds no tokenizer.json or tokenizer.model (its run trained on data without one): give --tokenizer DIR, "
            "a directory with the tokenizer.json that made the data (`tessera prepare --tokenizer gpt2` writes one for "
            "GPT-2's BPE)");
    auto tokenizer = load_tokenizer(own ? ckpt.dir : args->tokenizer);
    require(tokenizer->vocab_size() <= config.model.vocab_size, own ? ckpt.dir : args->tokenizer,
            "/tokenizer.json: vocabulary of ", tokenizer->vocab_size(), " tokens does not fit the model's ",
            config.model.vocab_size);
    args->sampling.vocab = tokenizer->vocab_size();
    std::cout << args->prompt << std::flush;
    generate_tokens(*model, tokenizer->encode(args->prompt), args->sampling,
                    [&](int64_t token) { std::cout << tokenizer->decode({token}) << std::flush; });
    std::cout << "\n";
    return 0;
  };
}

}  // namespace tessera::cli
