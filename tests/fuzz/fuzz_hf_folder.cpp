// libFuzzer target: a Hugging Face folder as `tessera import --hf` reads it, GPT-2's
// (model/hf_gpt2.h) or the Llama family's (model/hf_llama.h, by config.json's model_type):
// config.json turned into the model's options, and the weights through model.safetensors.index.json
// and the shard it names. The input is the three files' texts separated by lines "%%" (config.json,
// model.safetensors.index.json, model-00001-of-00001.safetensors; missing ones stay absent). Every
// input must be taken or end in tessera::Error; a config that imports must come back from
// hf_config_from_model_options (hf_llama_family_config) to the same options (the export writes what
// the import reads).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/json_file.h"
#include "fuzz_files.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string& dir = tessera::fuzz::scratch_dir("hf_folder");
  tessera::fuzz::write_parts(dir, input,
                             {"config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors"});
  std::optional<tessera::ModelOptions> llama;
  try {
    const tessera::ModelOptions base;
    const nlohmann::json config = tessera::read_json_file(dir + "/config.json");
    if (tessera::is_hf_llama_family(config)) {
      llama = tessera::llama_family_options_from_hf_config(config, base, "config.json");
      if (tessera::hf_llama_family_refusal(*llama).empty()) {
        const nlohmann::json written = tessera::hf_llama_family_config(*llama);
        const tessera::ModelOptions again = tessera::llama_family_options_from_hf_config(written, base, "written");
        if (tessera::hf_llama_family_config(again) != written) __builtin_trap();
      }
    } else {
      const tessera::ModelOptions opts = tessera::model_options_from_hf_config(config, base, "config.json");
      if (tessera::uses_hf_gpt2_names(opts)) {
        const nlohmann::json written = tessera::hf_config_from_model_options(opts);
        const tessera::ModelOptions again = tessera::model_options_from_hf_config(written, base, "written");
        if (tessera::hf_config_from_model_options(again) != written) __builtin_trap();
      }
    }
  } catch (const tessera::Error&) {
  }
  try {
    if (llama) tessera::read_hf_llama_weights(dir, *llama);
    else tessera::read_hf_gpt2_weights(dir);
  } catch (const tessera::Error&) {
  }
  return 0;
}
