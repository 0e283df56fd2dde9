"""Goldens for the data pipeline (tests/unit/data): a synthetic GPT-2 BPE vocabulary, the ids
OpenAI's encoder.py algorithm gives for test strings with it, and the Unicode classes of GPT-2's
pre-tokenisation pattern for every code point.

The real GPT-2 vocabulary cannot be downloaded here, so bpe/encoder.json and bpe/vocab.bpe are
trained on a few verses of the bundled corpus plus multilingual text by counting pairs (ties broken
by the smallest pair), in the files' exact formats. Encoding follows encoder.py line by line (byte
to unicode mapping, bpe() by rank); its pattern uses Python `re` classes ([^\\W\\d_] for \\p{L},
\\d for \\p{N}), which agree with \\p{L} and \\p{N} on every test string.

`python golden_data.py` prints src/data/gpt2_unicode_table.inc (the C++ class table) from the same
unicodedata classification the golden checks.
"""
import json
import pathlib
import re
import unicodedata

import torch

import st

ROOT = pathlib.Path(__file__).resolve().parents[2]

# GPT-2's pattern with Python `re` classes standing in for \p{L} and \p{N}.
PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")

CASES = [
    "Hello world",
    "In the beginning God created the heaven and the earth.",
    "  leading spaces,   runs of   spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand \t mixed \n whitespace",
    "don't you'll we've I'm she's they're he'd 'tis",
    "DON'T shout",
    "version 2.0 costs $1,234.56 in 2024!",
    "punctuation: (a) [b] {c} <d> ... ?! --- ___ @#%",
    "caf\u00e9 na\u00efve \u00e9l\u00e8ve",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u65e5\u672c",
    "emoji \U0001F600\U0001F389 and \u2764\ufe0f ok",
    "And God said, Let there be light: and there was light.\n",
]


def bytes_to_unicode():
    """encoder.py's reversible byte -> printable unicode character mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENCODER = bytes_to_unicode()


def words(text):
    return ["".join(BYTE_ENCODER[b] for b in w.encode("utf-8")) for w in PATTERN.findall(text)]


def train_merges(text, n_merges):
    counts = {}
    for w in words(text):
        counts[tuple(w)] = counts.get(tuple(w), 0) + 1
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for w, c in counts.items():
            for pair in zip(w, w[1:]):
                pairs[pair] = pairs.get(pair, 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for w, c in counts.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        counts = merged
    return merges


def bpe(token, ranks):
    """encoder.py's Encoder.bpe, unchanged apart from returning a list."""
    word = tuple(token)
    pairs = set(zip(word, word[1:]))
    if not pairs:
        return [token]
    while True:
        bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = set(zip(word, word[1:]))
    return list(word)


WHITE_SPACE = {9, 10, 11, 12, 13, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000} | \
    set(range(0x2000, 0x200B))
CLASSES = {"letter": 0, "number": 1, "space": 2, "other": 3}
UNASSIGNED = 255


def char_class(cp):
    """Class of a code point in GPT-2's pattern: \\p{L}, \\p{N}, \\s or neither; UNASSIGNED for Cn."""
    if cp in WHITE_SPACE:
        return CLASSES["space"]
    category = unicodedata.category(chr(cp))
    if category == "Cn":
        return UNASSIGNED
    return CLASSES["letter"] if category[0] == "L" else CLASSES["number"] if category[0] == "N" else CLASSES["other"]


def cpp_table():
    """Non-letter ranges above ASCII; unassigned code points join the run around them."""
    runs = []
    for cp in range(0x80, 0x110000):
        c = char_class(cp)
        if c == UNASSIGNED:
            continue
        if runs and runs[-1][2] == c:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, c])
    names = {1: "N", 2: "S", 3: "O"}
    entries = [f"{{0x{lo:X}, 0x{hi:X}, {names[c]}}}," for lo, hi, c in runs if c != 0]
    lines = [" ".join(entries[i:i + 4]) for i in range(0, len(entries), 4)]
    head = (f"// Generated by `python tests/golden/golden_data.py` from Unicode {unicodedata.unidata_version}: the\n"
            "// non-letter ranges above ASCII, sorted (N = \\p{N}, S = \\s, O = neither). Code points in no range\n"
            "// are letters; unassigned code points take the class of the run around them. Do not edit.\n")
    return head + "\n".join(lines) + "\n"


def generate(out):
    bpe_dir = out / "bpe"
    bpe_dir.mkdir(parents=True, exist_ok=True)
    corpus = (ROOT / "data/kjv/genesis_to_ruth.txt").read_text(encoding="utf-8")
    training = corpus[:20000] + " ".join(CASES) * 20
    merges = train_merges(training, 300)
    encoder = {c: i for i, c in enumerate(BYTE_ENCODER.values())}  # GPT-2's order: printable bytes first
    for a, b in merges:
        assert a + b not in encoder, f"merge {a} {b} repeats a token"
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    (bpe_dir / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (bpe_dir / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                       encoding="utf-8")
    ranks = {m: i for i, m in enumerate(merges)}
    tensors, metadata = {}, {"cases": str(len(CASES)), "vocab_size": str(len(encoder))}
    for i, text in enumerate(CASES):
        ids = [encoder[t] for w in words(text) for t in bpe(w, ranks)]
        tensors[f"ids_{i}"] = torch.tensor(ids, dtype=torch.int64)
        metadata[f"text_{i}"] = text
        metadata[f"pieces_{i}"] = json.dumps(PATTERN.findall(text))
    st.save(out / "bpe_cases.safetensors", tensors, metadata)
    classes = torch.tensor([char_class(cp) for cp in range(0x110000)], dtype=torch.uint8)
    st.save(out / "gpt2_char_classes.safetensors", {"classes": classes},
            {"unicode": unicodedata.unidata_version})


if __name__ == "__main__":
    print(cpp_table(), end="")
