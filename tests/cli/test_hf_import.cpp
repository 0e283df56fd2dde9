// `tessera import --hf` and `tessera train --init-from`, without transformers: a trained model
// exported as a Hugging Face folder and imported back is the same model (same greedy text, same
// losses when training starts from it), and every folder that cannot be imported exactly is
// refused naming the key or tensor. The comparison with transformers itself is tests/hf/.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/safetensors.h"
#include "cli_util.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

std::string settings(int64_t steps) {
  return tiny_settings(prepared_corpus()) + " --set train.steps=" + std::to_string(steps) + " --set eval.every=0";
}

// A run of `steps` steps of the tiny model, trained once per process.
const std::string& trained_run() {
  static const std::string run = [] {
    const std::string out = fresh_dir("hf_trained");
    auto r = run_tessera("train --config tiny_gpt" + settings(20) + " --out " + out);
    if (r.exit_code != 0) throw std::runtime_error("training failed: " + r.output);
    return out;
  }();
  return run;
}

// trained_run() exported with --hf into a folder of its own.
std::string exported_folder(const std::string& name) {
  const std::string folder = fresh_dir(name);
  auto r = run_tessera("export --checkpoint " + trained_run() + " --hf " + folder);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return folder;
}

std::string greedy(const std::string& checkpoint) {
  auto r = run_tessera("generate --checkpoint " + checkpoint + " --tokenizer " + prepared_corpus() +
                       " --prompt 'And God' --max-tokens 30 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& line : metrics_lines(run_dir))
    if (line.contains("loss")) out.push_back(line["loss"]);
  return out;
}

void write_json(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump(2);
}

TEST(Import, ExportedFolderImportsToTheSameModel) {
  const std::string folder = exported_folder("hf_export_roundtrip"), imported = fresh_dir("hf_imported");
  fs::remove_all(imported);
  auto r = run_tessera("import --hf " + folder + " --out " + imported);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("n_layer 2, n_head 2, n_embd 32, vocab_size 256, block_size 32"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(imported + "/latest"));
  const std::string text = greedy(imported);
  EXPECT_EQ(text, greedy(trained_run()));
  EXPECT_GT(text.size(), 30u);
}

// GPT-2's BPE travels with the model: the run's tokenizer becomes the folder's vocab.json and
// merges.txt, and the imported checkpoint's tokenizer again, so generate needs no --tokenizer.
TEST(Import, Gpt2TokenizerTravelsThroughTheFolder) {
  const std::string data = fresh_dir("hf_bpe_data"), run = fresh_dir("hf_bpe_run"), folder = fresh_dir("hf_bpe_folder"),
                    imported = fresh_dir("hf_bpe_imported");
  auto prepared = run_tessera("prepare --input " + source_path("data/kjv/genesis_to_ruth.txt") + " --out " + data +
                              " --tokenizer gpt2 --encoder " + golden_path("bpe/encoder.json") + " --merges " +
                              golden_path("bpe/vocab.bpe"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  auto trained = run_tessera("train --config tiny_gpt" + tiny_settings(data) +
                             " --set model.vocab_size=557 --set train.steps=10 --set eval.every=0 --out " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_EQ(run_tessera("export --checkpoint " + run + " --hf " + folder).exit_code, 0);
  EXPECT_TRUE(fs::exists(folder + "/vocab.json") && fs::exists(folder + "/merges.txt"));
  fs::remove_all(imported);
  auto r = run_tessera("import --hf " + folder + " --out " + imported);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: GPT-2 BPE from vocab.json and merges.txt"), std::string::npos) << r.output;
  const std::string args = " --prompt 'And God said' --max-tokens 20 --temperature 0";
  auto expected = run_tessera("generate --checkpoint " + run + args), actual = run_tessera("generate --checkpoint " + imported + args);
  ASSERT_EQ(actual.exit_code, 0) << actual.output;
  EXPECT_EQ(actual.output, expected.output);
}

TEST(Import, TrainingFromTheImportedModelEqualsTrainingFromTheRun) {
  const std::string folder = exported_folder("hf_export_for_init"), imported = fresh_dir("hf_imported_init");
  fs::remove_all(imported);
  ASSERT_EQ(run_tessera("import --hf " + folder + " --out " + imported).exit_code, 0);
  const std::string from_import = fresh_dir("init_from_import"), from_run = fresh_dir("init_from_run"),
                    fresh = fresh_dir("init_fresh");
  auto a = run_tessera("train --config tiny_gpt" + settings(4) + " --init-from " + imported + " --out " + from_import);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("initialized from the model of"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("# init-from"), std::string::npos) << a.output;
  auto b = run_tessera("train --config tiny_gpt" + settings(4) + " --init-from " + trained_run() + " --out " + from_run);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(run_tessera("train --config tiny_gpt" + settings(4) + " --out " + fresh).exit_code, 0);
  // The export and import are exact (fp32 in, fp32 out), so the two starts train alike; both
  // start from the trained model, far below a fresh one, at step 1 of their own runs.
  EXPECT_EQ(losses(from_import), losses(from_run));
  ASSERT_EQ(losses(from_import).size(), 4u);
  EXPECT_LT(losses(from_import)[0], 0.85 * losses(fresh)[0]);
  EXPECT_EQ(metrics_lines(from_import)[0]["step"], 1);
}

TEST(Import, ModelKeysThatDisagreeWithTheInitCheckpointAreRefused) {
  expect_error("train --config tiny_gpt" + settings(2) + " --set model.n_layer=3 --init-from " + trained_run(),
               {"model.n_layer = 3 (--set) disagrees with the model of --init-from", "model.n_layer = 2"});
  expect_error("train --init-from " + trained_run(), {"--init-from: give --config"});
}

TEST(Import, ImportedCheckpointIsRefusedByResume) {
  const std::string folder = exported_folder("hf_export_resume"), imported = fresh_dir("hf_imported_resume");
  fs::remove_all(imported);
  ASSERT_EQ(run_tessera("import --hf " + folder + " --out " + imported).exit_code, 0);
  expect_error("train --resume " + imported + " --out " + fresh_dir("resume_imported"),
               {"is an imported model without training state", "--init-from"});
}

TEST(Import, FoldersThatCannotBeImportedExactlyAreRefused) {
  const std::string folder = exported_folder("hf_bad_folder");
  const nlohmann::json config = nlohmann::json::parse(slurp(folder + "/config.json"));
  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json changed = config;
    changed[key] = value;
    write_json(folder + "/config.json", changed);
  };
  auto import = [&](std::initializer_list<std::string> needles) {
    const std::string out = fresh_dir("hf_bad_out");
    fs::remove_all(out);
    expect_error("import --hf " + folder + " --out " + out, needles);
  };
  with("model_type", "bert");
  import({"config.json: model_type 'bert' cannot be imported", "gpt2, llama, mistral, qwen2 and qwen3"});
  with("model_type", "llama");  // a GPT-2 config read as Llama's: its keys are not there
  import({"config.json: 'hidden_size' is missing or not a positive integer"});
  // A key of the wrong JSON type is named (fuzz target hf_folder found these ending in
  // nlohmann::json's type_error).
  with("model_type", 0);
  import({"config.json: 'model_type' = 0 is not a string"});
  with("layer_norm_epsilon", "1e-5");
  import({"'layer_norm_epsilon' = \"1e-5\" is not a number"});
  with("activation_function", "gelu");
  import({"activation_function 'gelu' cannot be imported", "tanh GELU"});
  with("scale_attn_by_inverse_layer_idx", true);
  import({"'scale_attn_by_inverse_layer_idx' = true cannot be imported"});
  with("tie_word_embeddings", false);
  import({"'tie_word_embeddings' = false"});
  with("n_inner", 100);
  import({"n_inner = 100 is not a multiple of n_embd = 32"});
  with("n_embd", 64);
  import({"tensor 'transformer.wte.weight' has shape [256, 32], the model expects [256, 64]"});
  with("n_layer", 3);
  import({"missing tensor 'transformer.h.2.attn.c_attn.bias'"});
  with("n_layer", -1);
  import({"'n_layer' is missing or not a positive integer"});
  write_json(folder + "/config.json", config);

  // An untied head, and a folder with only pytorch_model.bin.
  SafetensorsContents model = read_safetensors(folder + "/model.safetensors");
  NamedTensors tensors(model.tensors.begin(), model.tensors.end());
  tensors.emplace_back("lm_head.weight", model.tensors.at("transformer.wte.weight") * 2);
  write_safetensors(folder + "/model.safetensors", tensors);
  import({"lm_head.weight differs from the token embedding", "untied head"});
  fs::rename(folder + "/model.safetensors", folder + "/pytorch_model.bin");
  import({"holds no model.safetensors", "pytorch_model.bin", "safe_serialization=True"});

  const std::string used = fresh_dir("hf_used_out");
  std::ofstream(used + "/something") << "x";
  expect_error("import --hf " + folder + " --out " + used, {"is not an empty directory"});
}

}  // namespace
}  // namespace tessera::test
