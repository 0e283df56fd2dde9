"""tessera <-> Hugging Face transformers, both ways, with the pinned torch and transformers.

  Import.HuggingFaceGpt2GreedyTextMatchesTransformers
      A GPT2LMHeadModel with random weights and a shape no preset has, saved by save_pretrained,
      goes through `tessera import --hf`; `tessera generate --temperature 0` writes the bytes that
      transformers' greedy generate() gives.
  Import.LlamaFolderKeepsItsTokenizerAndGenerationConfigBothWays
      A LlamaForCausalLM folder with a byte-level BPE tokenizer trained by `tokenizers`
      (tokenizer.json, tokenizer_config.json, special_tokens_map.json) and a generation_config.json
      saved in shards of 40 kB goes through `tessera import --hf`, which writes it part by part
      (one file for the ends, each block and the final norm): `tessera generate` with the checkpoint's own tokenizer
      writes the text transformers' greedy generate() decodes, and `tessera export --hf` writes the
      four files back byte for byte, so AutoTokenizer and GenerationConfig read them as before;
      so does the export of a run fine-tuned from the import (`train --init-from`) on data prepared
      with the folder's tokenizer.
  Export.TesseraCheckpointLoadsInTransformersWithTheSameGreedyText
      A model tessera trained, written by `tessera export --hf`, loads with from_pretrained and
      greedy-decodes what `tessera generate` writes from the checkpoint.
  Export.TesseraLlamaLoadsInTransformersWithTheSameGreedyText
      The same for tiny_llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention, an
      untied head): `tessera export --hf` writes a LlamaForCausalLM folder, part by part, here in
      one file per part (--max-shard-mb 0.05) with model.safetensors.index.json.
  Export.TesseraMixtralLoadsInTransformersWithTheSameGreedyText
      The same for tiny_mixtral (top-2 of 8 SwiGLU experts in every block): a MixtralForCausalLM
      folder.

Except in the Llama import, the vocabulary is bytes (256 tokens, tessera's byte tokenizer), so
token ids are the text's bytes and the comparison needs no tokenizer in transformers. Exits 77 (CTest's skip) with a
message only when transformers cannot be imported.

usage: test_hf_roundtrip.py TESSERA_BINARY WORK_DIR CASE SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers
except ImportError as e:  # the project's venv pins both (scripts/install.sh)
    print(f"SKIP: transformers is not installed in this Python ({e}); scripts/install.sh installs it")
    sys.exit(77)

BINARY, WORK, CASE, SOURCE = sys.argv[1:5]
PROMPT = b"And Moses said unto"
NEW_TOKENS = 40


def tessera(*args):
    result = subprocess.run([BINARY, *args], capture_output=True)
    if result.returncode != 0:
        sys.exit(f"tessera {' '.join(args)} failed ({result.returncode}):\n"
                 f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}")
    return result.stdout


def byte_tokenizer_dir():
    path = os.path.join(WORK, "byte_tokenizer")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump({"type": "byte"}, f)
    return path


def tessera_greedy(checkpoint):
    out = tessera("generate", "--checkpoint", checkpoint, "--tokenizer", byte_tokenizer_dir(), "--prompt",
                  PROMPT.decode(), "--max-tokens", str(NEW_TOKENS), "--temperature", "0")
    assert out.startswith(PROMPT) and out.endswith(b"\n"), out
    return out[len(PROMPT):-1]


def transformers_greedy(folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None  # all NEW_TOKENS bytes, as tessera writes them
    ids = torch.tensor([list(PROMPT)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                             attention_mask=torch.ones_like(ids), pad_token_id=0)
    return bytes(out[0, ids.shape[1]:].tolist())


def expect_same(tessera_text, hf_text, what):
    if len(set(hf_text)) < 4:
        sys.exit(f"{what}: the greedy text {hf_text!r} has too few distinct bytes to tell models apart")
    if tessera_text != hf_text:
        sys.exit(f"{what}: greedy text differs\n  tessera:      {tessera_text!r}\n  transformers: {hf_text!r}")
    print(f"{what}: {len(hf_text)} identical greedy bytes {hf_text!r}")


def import_case():
    torch.manual_seed(3)
    # initializer_range 0.2: logits far apart, so greedy choices do not hinge on rounding.
    config = transformers.GPT2Config(vocab_size=256, n_positions=96, n_embd=48, n_layer=3, n_head=6,
                                     initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=None, eos_token_id=None)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # biases and LayerNorm parameters away from their 0 / 1 initial values
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    folder = os.path.join(WORK, "hf_model")
    model.save_pretrained(folder)
    out = os.path.join(WORK, "imported")
    print(tessera("import", "--hf", folder, "--out", out).decode())
    expect_same(tessera_greedy(out), transformers_greedy(folder), "import")


def llama_import_case():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    with open(os.path.join(SOURCE, "data/kjv/genesis_to_ruth.txt"), encoding="utf-8") as f:
        text = f.read()[:300000]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=160,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.max_new_tokens = 17  # a field of its own, to see it come back
    folder = os.path.join(WORK, "hf_llama")
    # In shards of at most 40 kB, as the Hub's large models come: a block's q, k and v may lie in
    # different files, and the import reads the folder part by part (model/hf_llama.h).
    model.save_pretrained(folder, max_shard_size="40KB")
    shards = [name for name in os.listdir(folder) if name.startswith("model-") and name.endswith(".safetensors")]
    if len(shards) < 3 or not os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        sys.exit(f"save_pretrained(max_shard_size='40KB') wrote {sorted(os.listdir(folder))}: the fixture is not sharded")
    tokenizer.save_pretrained(folder)
    special = os.path.join(folder, "special_tokens_map.json")
    if not os.path.exists(special):  # transformers 4 wrote it; 5 keeps it inside tokenizer_config.json
        with open(special, "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f, indent=2)
    carried = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
    missing = [name for name in carried if not os.path.exists(os.path.join(folder, name))]
    if missing:
        sys.exit(f"transformers did not write {missing} into {folder}: the test's fixture is wrong")

    out = os.path.join(WORK, "imported")
    said = tessera("import", "--hf", folder, "--out", out).decode()
    print(said)
    if "tokenizer: Hugging Face's byte-level BPE from tokenizer.json" not in said:
        sys.exit(f"import did not report the folder's tokenizer:\n{said}")
    # Written part by part: the ends, each of the 2 blocks, the final norm.
    step = os.path.join(out, "step_0")
    parts = sorted(name for name in os.listdir(step) if name.startswith("model-"))
    if parts != [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)]:
        sys.exit(f"import of {len(shards)} shards wrote {parts}, not one file per part (the ends, 2 blocks, the norm)")
    prompt = PROMPT.decode()
    generated = tessera("generate", "--checkpoint", out, "--prompt", prompt, "--max-tokens", "20",
                        "--temperature", "0")
    assert generated.startswith(PROMPT) and generated.endswith(b"\n"), generated
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    with torch.no_grad():
        new = model.generate(ids, max_new_tokens=20, do_sample=False, num_beams=1, eos_token_id=None,
                             attention_mask=torch.ones_like(ids), pad_token_id=0)[0, ids.shape[1]:]
    # transformers' decode turns bytes that are not UTF-8 into U+FFFD; tessera writes the bytes.
    ours = generated[len(PROMPT):-1].decode("utf-8", errors="replace").encode()
    expect_same(ours, tokenizer.decode(new.tolist()).encode(), "import (llama, BPE)")

    exported = os.path.join(WORK, "exported")
    print(tessera("export", "--checkpoint", out, "--hf", exported).decode())
    for name in carried:
        with open(os.path.join(folder, name), "rb") as a, open(os.path.join(exported, name), "rb") as b:
            if a.read() != b.read():
                sys.exit(f"export --hf: {name} differs from the imported folder's")
    back = transformers.AutoTokenizer.from_pretrained(exported)
    sample = text[1000:3000]
    if back(sample).input_ids != tokenizer(sample).input_ids:
        sys.exit("export --hf: the exported tokenizer encodes differently")
    if transformers.GenerationConfig.from_pretrained(exported).to_dict() != model.generation_config.to_dict():
        sys.exit("export --hf: the exported generation_config.json reads differently")
    print(f"export (llama): {', '.join(carried)} written back byte for byte")

    # Fine-tuned on data prepared with the folder's tokenizer, the model exports with the same files.
    data, run, tuned = (os.path.join(WORK, name) for name in ("data", "run", "tuned"))
    tessera("prepare", "--input", os.path.join(SOURCE, "data/kjv/genesis_to_ruth.txt"), "--out", data,
            "--tokenizer", f"hf:{folder}")
    settings = os.path.join(WORK, "fine_tune.toml")  # no [model]: the import's holds
    with open(settings, "w") as f:
        f.write(f'[data]\npath = "{data}"\n\n[train]\nsteps = 2\nseq_len = 64\nbatch_size = 2\n\n'
                '[eval]\nevery = 0\n')
    tessera("train", "--config", settings, "--init-from", out, "--out", run)
    print(tessera("export", "--checkpoint", run, "--hf", tuned).decode())
    for name in carried:
        with open(os.path.join(folder, name), "rb") as a, open(os.path.join(tuned, name), "rb") as b:
            if a.read() != b.read():
                sys.exit(f"export --hf after fine-tuning: {name} differs from the imported folder's")
    print(f"export after fine-tuning (llama): {', '.join(carried)} written back byte for byte")


def export_case(config="tiny_gpt", what="export", steps=60, seq_len=128):
    data, run = os.path.join(WORK, "data"), os.path.join(WORK, "run")
    tessera("prepare", "--input", os.path.join(SOURCE, "data/kjv/genesis_to_ruth.txt"), "--out", data,
            "--tokenizer", "byte")
    tessera("train", "--config", config, "--set", f"data.path={data}", "--set", f"train.steps={steps}",
            "--set", f"train.seq_len={seq_len}", "--set", "eval.every=0", "--set", "model.vocab_multiple=64", "--out", run, "--overwrite")
    folder = os.path.join(WORK, "exported")
    if config == "tiny_gpt":
        print(tessera("export", "--checkpoint", run, "--hf", folder).decode())
    else:
        # A Llama-family model is exported part by part: with files of at most 50 kB, one per part
        # (the embedding and head, each block, the norm) in transformers' sharded layout.
        print(tessera("export", "--checkpoint", run, "--hf", folder, "--max-shard-mb", "0.05").decode())
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        layers = json.load(open(os.path.join(folder, "config.json")))["num_hidden_layers"]
        if len(files) != layers + 2 or os.path.exists(os.path.join(folder, "model.safetensors")):
            sys.exit(f"export --hf --max-shard-mb 0.05 wrote {files}: not one file per part of {layers} blocks")
    expect_same(tessera_greedy(run), transformers_greedy(folder), what)


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
{"import": import_case, "import_llama": llama_import_case, "export": export_case,
 # 200 steps: at 60 (or 100, or 120 at twice the learning rate) tiny_llama's and tiny_mixtral's
 # greedy text is " the the the ...", too few distinct bytes to tell much; windows of 64 tokens
 # (the prompt and the 40 new ones fit) halve the training time.
 "export_llama": lambda: export_case("tiny_llama", "export (tiny_llama)", 200, 64),
 "export_mixtral": lambda: export_case("tiny_mixtral", "export (tiny_mixtral)", 200, 64)}[CASE]()
