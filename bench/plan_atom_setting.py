#!/usr/bin/env python3
"""The planner in ATOM's setting (seed 000): GPT-3-family models on consumer GPUs (clusters/
consumer_24g_1gbe.toml: an RTX 3090 per host) joined by 10 Gbit, 1 Gbit or 100 Mbit Ethernet.

For each model, link and global batch (64 and 1024 sequences of 2048 tokens per optimizer step),
`tessera plan` predicts the best layout of each family on 8 hosts:
  pipeline     parallel.pp = 8 held (schedule, micro-batch and checkpointing searched)
  data         parallel.pp = tp = sp = 1 held, no [peers] link (DDP or ZeRO 1-3, with or without
               offload, searched)
  ATOM batch   swarm.sync = batch held: 8 peers, each resident or swapped, averaging the float32
               gradients of the whole global batch every step (ATOM's arithmetic)
  DiLoCo       swarm.sync = diloco held, int8 pseudo-gradients every 50 local steps of the peer's
               share of the global batch
Samples per second are predicted, not measured: nothing here ran. The link's rate goes into both
[inter_node] and [peers] (88% of the line rate, as this machine's tbf links deliver); everything
else is the preset's.

usage: bench/plan_atom_setting.py [--tessera build/tessera] [--out bench/results/plan_atom_setting.md]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

from results_file import write_results

MODELS = {  # GPT-3's table 2.1 shapes (heads so that the head width is 128)
    "GPT-3 XL 1.3B": (24, 2048, 16),
    "GPT-3 2.7B": (32, 2560, 20),
    "GPT-3 6.7B": (32, 4096, 32),
}
LINKS = {"10 Gbit": 10e9, "1 Gbit": 1e9, "100 Mbit": 100e6}
FAMILIES = ["pipeline", "data", "ATOM batch", "DiLoCo int8 / 50"]


def cluster_file(directory, rate_bits, peers):
    text = open("clusters/consumer_24g_1gbe.toml").read()
    gbs = 0.88 * rate_bits / 8 / 1e9
    text = re.sub(r"(\[inter_node\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{gbs:.6g}", text)
    if peers:
        text = re.sub(r"(\[peers\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{gbs:.6g}", text)
    else:
        text = text[:text.index("[peers]")]
    path = os.path.join(directory, f"consumer_{int(rate_bits)}_{'peers' if peers else 'nopeers'}.toml")
    open(path, "w").write(text)
    return path


def best(binary, cluster, shape, sets, global_batch):
    layers, width, heads = shape
    args = [binary, "plan", "--config", "gpt3_175b", "--cluster", cluster, "--world", "8", "--top", "1", "--json",
            "--set", f"model.n_layer={layers}", "--set", f"model.n_embd={width}", "--set", f"model.n_head={heads}",
            "--set", f"train.global_batch_size={global_batch}"]
    for kv in sets:
        args += ["--set", kv]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    layout = json.loads(out.stdout)["layouts"][0]
    return layout if layout["fits"] else None


def describe(layout):
    s = layout["set"]
    if layout["peers"]:
        return f"{'swapped' if s.get('memory.swap') == 'true' else 'resident'} peers, mb {s['train.batch_size']}"
    parts = []
    if s.get("parallel.pp", "1") != "1":
        parts.append(s.get("parallel.pp_schedule", ""))
    parts.append(f"ZeRO-{s['parallel.zero_stage']}")
    if s.get("parallel.offload") == "true":
        parts.append("offload")
    if s.get("memory.swap") == "true":
        parts.append("swap")
    parts.append(f"ckpt {s['memory.activation_checkpointing']}")
    return ", ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--out", default="bench/results/plan_atom_setting.md")
    args = ap.parse_args()
    lines = ["# The planner in ATOM's setting: GPT-3-family models on 8 consumer GPUs over Ethernet (predicted)", "",
             f"`python3 bench/plan_atom_setting.py`. {__doc__.splitlines()[0]}", "",
             "Predicted samples per second (2048-token sequences) of each family's best layout that fits; "
             "the last column is ATOM batch mode over the faster pipeline-or-data layout.", ""]
    with tempfile.TemporaryDirectory() as d:
        for model, shape, global_batch in [(m, s, g) for g in (64, 1024) for m, s in MODELS.items()]:
            lines += [f"## {model}, {global_batch} sequences per step", "", "| link | " + " | ".join(FAMILIES) + " | ATOM batch / best of pipeline, data |",
                      "|---|" + "---|" * (len(FAMILIES) + 1)]
            for link, rate in LINKS.items():
                with_peers, without = cluster_file(d, rate, True), cluster_file(d, rate, False)
                results = {
                    "pipeline": best(args.tessera, without, shape, ["parallel.pp=8", "parallel.tp=1", "parallel.sp=1"], global_batch),
                    "data": best(args.tessera, without, shape, ["parallel.pp=1", "parallel.tp=1", "parallel.sp=1"], global_batch),
                    "ATOM batch": best(args.tessera, with_peers, shape, ["swarm.sync=batch"], global_batch),
                    "DiLoCo int8 / 50": best(args.tessera, with_peers, shape,
                                             ["swarm.sync=diloco", "swarm.pseudo_gradient_dtype=int8", "swarm.inner_steps=50"],
                                             global_batch),
                }
                cells, rates = [], {}
                for family in FAMILIES:
                    r = results[family]
                    if r is None:
                        cells.append("does not fit")
                        continue
                    rates[family] = r["tokens_per_s"] / 2048
                    cells.append(f"{rates[family]:.2f} ({describe(r)})")
                rivals = [rates[f] for f in ("pipeline", "data") if f in rates]
                ratio = f"{rates['ATOM batch'] / max(rivals):.2f}x" if rivals and "ATOM batch" in rates else "-"
                lines.append(f"| {link} | " + " | ".join(cells) + f" | {ratio} |")
            lines.append("")
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
