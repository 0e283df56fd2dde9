#!/usr/bin/env python3
"""Loads a tessera GPT checkpoint into Hugging Face transformers and checks that both write the
same greedy continuation.

Usage: check_hf_export.py TESSERA_BINARY CHECKPOINT_DIR [--prompt TEXT] [--tokens N]

CHECKPOINT_DIR is a step directory of a dense GPT with the byte tokenizer. Its model.safetensors is
loaded
into transformers' GPT2LMHeadModel with strict key matching (every tensor name and shape must be
what GPT-2 uses: the point of the check), then both decode greedily from the prompt and the
texts are compared. Needs `transformers` importable (it is not a tessera dependency:
pip install transformers into any environment with torch). Exit 0 when they match.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tomllib

import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel


def hf_model(checkpoint):
    meta = json.loads((checkpoint / "meta.json").read_text())
    model = tomllib.loads(meta["config"])["model"]
    if model["arch"] != "gpt" or model["ffn"] != "dense":
        raise SystemExit(f"{checkpoint}: model.arch = {model['arch']}, model.ffn = {model['ffn']}; "
                         "only dense GPT checkpoints use GPT-2's layout")
    config = GPT2Config(vocab_size=model["vocab_size"], n_positions=model["block_size"], n_embd=model["n_embd"],
                        n_layer=model["n_layer"], n_head=model["n_head"], n_inner=model["mlp_ratio"] * model["n_embd"],
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None)
    net = GPT2LMHeadModel(config)
    state = load_file(str(checkpoint / "model.safetensors"))
    state["lm_head.weight"] = state["transformer.wte.weight"]
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise SystemExit(f"{checkpoint}/model.safetensors: missing {missing}, unexpected {unexpected}")
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    if tokenizer.get("type") != "byte":
        raise SystemExit(f"{checkpoint}/tokenizer.json: this check decodes byte-level checkpoints only")
    return net.eval(), model["block_size"]


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("tessera")
    a.add_argument("checkpoint", type=pathlib.Path)
    a.add_argument("--prompt", default="In the beginning")
    a.add_argument("--tokens", type=int, default=60)
    args = a.parse_args()
    net, block = hf_model(args.checkpoint)
    ids = torch.tensor([list(args.prompt.encode())])
    with torch.no_grad():
        out = net.generate(ids, max_new_tokens=min(args.tokens, block - ids.shape[1]), do_sample=False,
                           pad_token_id=0, attention_mask=torch.ones_like(ids))
    hf_text = bytes(out[0].tolist()).decode("utf-8", errors="replace")
    run = subprocess.run([args.tessera, "generate", "--checkpoint", str(args.checkpoint), "--prompt", args.prompt,
                          "--max-tokens", str(min(args.tokens, block - ids.shape[1])), "--temperature", "0"],
                         capture_output=True, text=True, check=True)
    tessera_text = run.stdout.rstrip("\n")
    print("transformers:", repr(hf_text))
    print("tessera:     ", repr(tessera_text))
    if tessera_text != hf_text:
        sys.exit("MISMATCH: the checkpoint does not behave the same in transformers")
    print(f"match: {len(hf_text) - len(args.prompt)} greedy bytes identical")


if __name__ == "__main__":
    main()
