"""Reference ids of Hugging Face tokenizers, for tests/hf/test_hf_tokenizers.cpp.

Three byte-level BPE tokenizers are trained by the `tokenizers` library (what transformers runs)
on the bundled corpus and a multilingual text, each with the pre-tokenization of a family:
  llama3  Llama 3's Split regex (digits in threes) then ByteLevel, ignore_merges, special tokens
  qwen2   Qwen 2's regex (single digits), the NFC normalizer, special tokens
  gpt2    ByteLevel with GPT-2's own regex
Each is saved as WORK/<name>/tokenizer.json, and transformers' PreTrainedTokenizerFast over that
file writes the references (plain encode, add_special_tokens=False; decode keeping special tokens).
A fourth, WORK/sentencepiece/tokenizer.model, is a SentencePiece BPE model trained as Llama 2's was
(byte fallback, identity normalization, a dummy prefix, digits split), with the sentencepiece
library's ids and decoded texts as references (skipped when that library is missing):
  WORK/<name>/reference.json   {"type": ..., "texts": [...], "ids": [[...]], "decoded": [...]}
  WORK/<name>/corpus.ids       the bundled corpus's ids, little-endian int32
Exits 77 (CTest's skip) with a message when transformers cannot be imported.

usage: make_tokenizer_references.py WORK_DIR CORPUS
"""
import json
import os
import shutil
import sys

try:
    import numpy
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:
    print(f"SKIP: transformers is not installed in this Python ({e}); scripts/install.sh installs it")
    sys.exit(77)

WORK, CORPUS = sys.argv[1:3]
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
MULTILINGUAL = [
    "Hello world! It's 2026; we'll see 1234567 apples and 3.14159 pies. They'VE GOT IT, I'M sure.",
    "naïve café, Ünïcödé façade — «quotes» and “curly” ones…",
    "你好，世界。日本語のテキストです。한국어 문장도 있습니다. Ελληνικά και русский текст.",
    "emoji 😀👍🏽🇩🇪 and 👨‍👩‍👧 families",
    "  leading spaces,\ttabs\t\tand   runs    of spaces   \n\n\nnewlines\r\nand CRLF\r\n  \n",
    "<|begin_of_text|>special tokens<|end_of_text|> inside <|im_start|>text<|im_end|>",
    "decomposed: e\u0301 a\u0308 o\u0302 (NFD), and 12 345 6789 0",
    "code: def f(x):\n    return x**2  # comment\n\tif x != 0: print(f'{x}')",
]

corpus = open(CORPUS, encoding="utf-8").read()
shutil.rmtree(WORK, ignore_errors=True)
for name in ("llama3", "qwen2", "gpt2"):
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] if name == "llama3" else ["<|endoftext|>", "<|im_start|>",
                                                                               "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE(ignore_merges=name == "llama3"))
    if name == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if name == "llama3" else QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if name == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([corpus] + MULTILINGUAL * 20, trainer=trainer)
    folder = os.path.join(WORK, name)
    os.makedirs(folder)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))

    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    ids = [fast.encode(text, add_special_tokens=False) for text in MULTILINGUAL]
    decoded = [fast.decode(i, skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"type": "hf_bpe", "texts": MULTILINGUAL, "ids": ids, "decoded": decoded}, f, ensure_ascii=False)
    corpus_ids = fast.encode(corpus, add_special_tokens=False)
    numpy.asarray(corpus_ids, dtype="<i4").tofile(os.path.join(folder, "corpus.ids"))
    print(f"{name}: vocab {tokenizer.get_vocab_size()}, corpus {len(corpus_ids)} tokens")

try:
    import sentencepiece
except ImportError as e:
    print(f"sentencepiece: skipped ({e}); scripts/install.sh installs it")
    sys.exit(0)
folder = os.path.join(WORK, "sentencepiece")
os.makedirs(folder)
training = os.path.join(folder, "training.txt")
with open(training, "w", encoding="utf-8") as f:
    f.write(corpus + "\n".join(MULTILINGUAL * 20))
sentencepiece.SentencePieceTrainer.train(
    input=training, model_prefix=os.path.join(folder, "tokenizer"), vocab_size=1200, model_type="bpe",
    byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
    split_digits=True, allow_whitespace_only_pieces=True, user_defined_symbols=["<|tool|>"], minloglevel=2)
os.remove(training)
os.remove(os.path.join(folder, "tokenizer.vocab"))
processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
texts = MULTILINGUAL + [" leading space", "user <|tool|> symbol", ""]
ids = [processor.encode(text) for text in texts]
with open(os.path.join(folder, "reference.json"), "w") as f:
    json.dump({"type": "sentencepiece", "texts": texts, "ids": ids, "decoded": [processor.decode(i) for i in ids]}, f,
              ensure_ascii=False)
corpus_ids = processor.encode(corpus)
numpy.asarray(corpus_ids, dtype="<i4").tofile(os.path.join(folder, "corpus.ids"))
print(f"sentencepiece: vocab {processor.get_piece_size()}, corpus {len(corpus_ids)} tokens")
