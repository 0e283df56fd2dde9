// SentencePiece BPE models (the tokenizer.model of Llama 2, Mistral, Mixtral), read and run by
// tessera itself: Debian's libsentencepiece exports the protobuf it bundles, which displaced
// Debian's libprotobuf-lite in the process and crashed the TensorBoard writer, so the model file
// is read here from protobuf's wire format (ModelProto: pieces 1 {piece 1, score 2, type 3},
// trainer_spec 2 {model_type 3, byte_fallback 35, unk_id 40, treat_whitespace_as_suffix 24},
// normalizer_spec 3 {name 1, precompiled_charsmap 2, add_dummy_prefix 3,
// remove_extra_whitespaces 4, escape_whitespaces 5}; unknown fields skipped).
//
// Encoding, as SentencePiece's BPE model does it:
//   1. normalize: the identity (no character map: Llama 2's and Mistral's "identity" rule);
//      remove_extra_whitespaces strips spaces at both ends and collapses runs; add_dummy_prefix
//      puts a space first (non-empty text); escape_whitespaces writes each space as U+2581;
//   2. split into characters (UTF-8 code points; user-defined pieces whole, longest first);
//   3. repeatedly merge the adjacent pair whose concatenation is a piece (normal, user-defined)
//      of the highest score, the leftmost among equals, until none is;
//   4. each symbol's id; a symbol that is no piece becomes its bytes' <0xXX> pieces (byte_fallback)
//      or the unknown id.
// No BOS or EOS is added (plain encode). Decoding writes each piece with U+2581 as a space, byte
// pieces as their bytes, control pieces as nothing and the unknown piece as " \u2047 ", then drops
// the first space where add_dummy_prefix put one. Round trip: decode(encode(s)) == s for any s
// without remove_extra_whitespaces and without unknown pieces.
//
// Refused naming the file: unigram, word and char models; a character map (nmt_nfkc and other
// normalization rules); treat_whitespace_as_suffix.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace tessera {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);

}  // namespace tessera
