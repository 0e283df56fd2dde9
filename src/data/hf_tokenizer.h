// Hugging Face tokenizers as users have them beside their checkpoints: tokenizer.json of a
// byte-level BPE (Llama 3, Qwen 2/3, GPT-2, DeepSeek): the model's vocab and
//     merges (either merge form: "a b" or ["a", "b"]), ignore_merges, added_tokens (special ones
//     included: matched in the text before anything else, each one id), normalizer null or NFC,
//     pre_tokenizer Split (a regex, behavior Isolated: regex_split.h) and ByteLevel (use_regex:
//     GPT-2's pattern) alone or in a Sequence. It becomes the one byte-level BPE of
//     byte_level_bpe.h (type "hf_bpe").
// A tokenizer.json converted from SentencePiece (Llama 2, Mistral: a BPE with byte_fallback, a
// Unigram, or a Metaspace pre-tokenizer) is read through the tokenizer.model beside it
// (data/sentencepiece.h; load_tokenizer decides).
//
// Encoding is plain: no BOS/EOS or chat template is added (transformers' add_special_tokens=False);
// special tokens written in the text are their ids. Decoding writes every token's text, special
// ones included (skip_special_tokens=False). Round trip: decode(encode(s)) == s for the byte-level
// BPE without a normalizer (any bytes) and with NFC where s is in NFC.
//
// What would encode differently is refused naming the file and the key (another model type, a
// normalizer or pre-tokenizer not listed, a Split that is not Isolated, added tokens that strip
// spaces). PCRE2 and utf8proc are needed (TESSERA_TOKENIZERS, CMakeLists.txt).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace tessera {

// Whether a parsed tokenizer.json is Hugging Face's (it has a "model" object) rather than
// tessera's own ({"type": ...}).
bool is_hf_tokenizer_json(const nlohmann::json& json);

// Whether Hugging Face's tokenizer.json was converted from a SentencePiece model.
bool is_sentencepiece_conversion(const nlohmann::json& json);

// The tokenizer whose tokenizer.json (`json`, read from `path`) is Hugging Face's.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const nlohmann::json& json);

}  // namespace tessera
