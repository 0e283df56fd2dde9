"""tessera <-> Hugging Face transformers, both ways, with the pinned torch and transformers.

  Import.HuggingFaceGpt2GreedyTextMatchesTransformers
      A GPT2LMHeadModel with random weights and a shape no preset has, saved by save_pretrained,
      goes through `tessera import --hf`; `tessera generate --temperature 0` writes the bytes that
      transformers' greedy generate() gives.
  Export.TesseraCheckpointLoadsInTransformersWithTheSameGreedyText
      A model tessera trained, written by `tessera export --hf`, loads with from_pretrained and
      greedy-decodes what `tessera generate` writes from the checkpoint.
  Export.TesseraLlamaLoadsInTransformersWithTheSameGreedyText
      The same for tiny_llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention, an
      untied head): `tessera export --hf` writes a LlamaForCausalLM folder.
  Export.TesseraMixtralLoadsInTransformersWithTheSameGreedyText
      The same for tiny_mixtral (top-2 of 8 SwiGLU experts in every block): a MixtralForCausalLM
      folder.

The vocabulary is bytes (256 tokens, tessera's byte tokenizer), so token ids are the text's
bytes and the comparison needs no tokenizer in transformers. Exits 77 (CTest's skip) with a
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


def export_case(config="tiny_gpt", what="export", steps=60, seq_len=128):
    data, run = os.path.join(WORK, "data"), os.path.join(WORK, "run")
    tessera("prepare", "--input", os.path.join(SOURCE, "data/kjv/genesis_to_ruth.txt"), "--out", data,
            "--tokenizer", "byte")
    tessera("train", "--config", config, "--set", f"data.path={data}", "--set", f"train.steps={steps}",
            "--set", f"train.seq_len={seq_len}", "--set", "eval.every=0", "--set", "model.vocab_multiple=64", "--out", run, "--overwrite")
    folder = os.path.join(WORK, "exported")
    print(tessera("export", "--checkpoint", run, "--hf", folder).decode())
    expect_same(tessera_greedy(run), transformers_greedy(folder), what)


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
{"import": import_case, "export": export_case,
 # 200 steps: at 60 (or 100, or 120 at twice the learning rate) tiny_llama's and tiny_mixtral's
 # greedy text is " the the the ...", too few distinct bytes to tell much; windows of 64 tokens
 # (the prompt and the 40 new ones fit) halve the training time.
 "export_llama": lambda: export_case("tiny_llama", "export (tiny_llama)", 200, 64),
 "export_mixtral": lambda: export_case("tiny_mixtral", "export (tiny_mixtral)", 200, 64)}[CASE]()
