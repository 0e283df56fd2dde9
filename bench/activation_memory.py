#!/usr/bin/env python3
"""What each activation memory saver keeps for the backward pass and what it costs (issue 53).

For each config (default tiny_gpt and tiny_llama, float32, one process) and each policy:
  memory.activation_compression = none, lossless, bf16, fp8, int8, int4 (no checkpointing), and int4
  with the attention core's tensors at int8 (int4+int8: memory.attention_compression = int8);
  memory.activation_checkpointing = selective, full (no compression); full with int8 and with int4;
it runs `tessera bench --json` in ROUNDS rounds, the policies of a round one after another, and
reports:
  saved KiB/token/block  saved_activation_bytes (what autograd held at the step's peak for the
                         blocks' backward, memory/saved_activations.h) over tokens x blocks;
  formula                the same from the block's operations, for the GPT block (fp32, the CPU's
                         fused attention, no dropout; docs/memory.md): 64 h + 16 + 4 a bytes
                         uncompressed (16 h floats, two norms' mean and rstd, the attention's
                         log-sum-exp per head), 32 h (bf16), 18 h (int8, fp8: a byte and a
                         4-byte scale per 32) or 10 h (int4: half a byte and the scale) for the
                         16 h floats; int4+int8 12 h (the core's q, k, v and output, 4 h, at
                         int8's 1.125 bytes, the other 12 h at int4's 0.625); full checkpointing
                         keeps the block's input, 4 h;
  x of none              the uncompressed figure over the policy's;
  step ms                the median over rounds of each round's median step;
  step / none            the median over rounds of the step over the same round's uncompressed
                         step (paired: this shared machine's speed drifts between rounds);
  peak host MiB          the process's peak tensor bytes during the timed steps (peak_bytes).
Written to bench/results/activation_memory_cpu.md.

usage: bench/activation_memory.py BUILD_DIR [--rounds 5] [--steps 10] [--configs tiny_gpt,tiny_llama]
                                  [--only int8,int4,int4+int8]
(--only: those compressions without checkpointing, beside none and full checkpointing; adaptive:BITS
is memory.activation_compression = adaptive at memory.activation_bits = BITS, no formula.)
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tessera_bench import compression_settings, tessera_bench  # noqa: E402

POLICIES = [
    ("none", "none"),
    ("lossless", "none"),
    ("bf16", "none"),
    ("fp8", "none"),
    ("int8", "none"),
    ("int4", "none"),
    ("int4+int8", "none"),
    ("none", "selective"),
    ("none", "full"),
    ("int8", "full"),
    ("int4", "full"),
]


def model_shape(build, config):
    """n_layer, n_embd, n_head and the block kinds, from `tessera inspect`'s first line."""
    out = subprocess.run([str(Path(build) / "tessera"), "inspect", "--config", config], capture_output=True, text=True,
                         check=True).stdout.splitlines()[0]
    words = out.replace(",", "").split()
    blocks = int(words[words.index("blocks") - 1])
    h = int(words[words.index("n_embd") + 1])
    a = int(words[words.index("heads") - 1])
    return blocks, h, a, out


def formula(compression, checkpointing, h, a):
    if compression.startswith("adaptive"):
        return None
    if checkpointing == "full":
        return 4 * h * {"none": 1, "lossless": 1, "bf16": 0.5, "fp8": 1.125 / 4, "int8": 1.125 / 4,
                        "int4": 0.625 / 4}[compression]
    if checkpointing != "none":
        return None
    floats = {"none": 64 * h, "lossless": 64 * h, "bf16": 32 * h, "fp8": 18 * h, "int8": 18 * h,
              "int4": 10 * h, "int4+int8": 12 * h}[compression]
    return floats + 16 + 4 * a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default="tiny_gpt,tiny_llama")
    ap.add_argument("--only", help="these compressions (no checkpointing), beside none and full")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "activation_memory_cpu.md"))
    args = ap.parse_args()
    policies = POLICIES
    if args.only:
        policies = [("none", "none")] + [(c, "none") for c in args.only.split(",")] + [("none", "full")]
    sections = []
    for config in args.configs.split(","):
        blocks, h, a, described = model_shape(args.build, config)
        runs = {p: [] for p in policies}
        for r in range(args.rounds):
            for p in policies:
                sets = {**compression_settings(p[0]), "memory.activation_checkpointing": p[1]}
                d = tessera_bench(args.build, config, sets, steps=args.steps, warmup=3)
                runs[p].append(d)
                print(f"{config} round {r} {p}: {d['median_step_s'] * 1e3:.1f} ms, saved {d['saved_activation_bytes']}",
                      flush=True)
        tokens = runs[policies[0]][0]["tokens_per_step"]
        base_saved = runs[("none", "none")][0]["saved_activation_bytes"]
        lines = [f"## {config}: {described}", "",
                 f"{int(tokens)} tokens per step, {args.rounds} rounds of {args.steps} timed steps; "
                 "formula for the GPT block only (docs/memory.md).", "",
                 "| compression | checkpointing | saved KiB/token/block | formula | x of none | step ms | step / none | peak host MiB |",
                 "|---|---|---|---|---|---|---|---|"]
        for p in policies:
            saved = runs[p][0]["saved_activation_bytes"]
            per = saved / tokens / blocks
            f = formula(p[0], p[1], h, a) if config.startswith("tiny_gpt") else None
            step = statistics.median(d["median_step_s"] for d in runs[p])
            paired = statistics.median(d["median_step_s"] / b["median_step_s"]
                                       for d, b in zip(runs[p], runs[("none", "none")]))
            peak = statistics.median(d["peak_bytes"] for d in runs[p]) / 2**20
            lines.append(f"| {p[0]} | {p[1]} | {per / 1024:.3f} | {f / 1024:.3f} |" if f is not None else
                         f"| {p[0]} | {p[1]} | {per / 1024:.3f} | - |")
            lines[-1] += f" {base_saved / max(saved, 1):.2f} | {step * 1e3:.1f} | {paired:.3f} | {peak:.1f} |"
        sections.append("\n".join(lines))
    head = ("# Activation memory on this machine's CPU\n\n"
            f"`python3 bench/activation_memory.py build --rounds {args.rounds} --steps {args.steps} "
            f"--configs {args.configs}{' --only ' + args.only if args.only else ''}` (2 cores, one process, float32).\n\n")
    Path(args.out).write_text(head + "\n\n".join(sections) + "\n")
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
