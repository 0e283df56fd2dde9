#!/usr/bin/env python3
"""Training throughput of this build against another (say, the previous commit's), layout by layout,
in one run: the runners of every kind (plain, data-parallel, pipeline, swapped) on the same model.

Each layout is a `tessera bench --json` run of tiny_gpt widened to 8 blocks (n_embd 128, 4 x 128
tokens per micro-batch, one intra-op thread per process, 8 timed steps after 2 warm-up steps); the
two builds alternate layout by layout for ROUNDS rounds and each keeps its best median step. On this
2-core machine multi-process layouts share the cores, so only the ratio between the builds is the
result: each build's best median step, and the paired ratio (this build's median step over the
baseline's within each round: the machine's drift between rounds cancels), its median and range.
Written to bench/results/regression_cpu.md, or --out.

usage: bench/regression.py BUILD_DIR BASELINE_BUILD_DIR [ROUNDS] [--only TEXT] [--out FILE]
  --only TEXT: the layouts whose name contains TEXT
"""
import argparse
import json
import statistics
import subprocess
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("build", type=Path)
parser.add_argument("baseline", type=Path)
parser.add_argument("rounds", type=int, nargs="?", default=3)
parser.add_argument("--only", default="")
parser.add_argument("--out", default="bench/results/regression_cpu.md")
ARGS = parser.parse_args()
BUILD, BASELINE, ROUNDS = ARGS.build, ARGS.baseline, ARGS.rounds
MODEL = ["--set", "model.n_layer=8", "--set", "model.n_embd=128", "--set", "model.n_head=4",
         "--set", "train.seq_len=128", "--set", "train.batch_size=4", "--set", "train.threads=1"]
LAYOUTS = [
    ("one process", 0, []),
    ("dp 2 (DDP)", 2, ["--set", "parallel.dp=2"]),
    ("dp 2 ZeRO-3", 2, ["--set", "parallel.dp=2", "--set", "parallel.zero_stage=3"]),
    ("pp 2 1F1B, 8 micro-batches", 2, ["--set", "parallel.pp=2", "--set", "train.grad_accum=8"]),
    ("pp 2 ZB-H1, 8 micro-batches", 2, ["--set", "parallel.pp=2", "--set", "parallel.pp_schedule=zbh1",
                                        "--set", "train.grad_accum=8"]),
    ("dp 2 x pp 2 ZeRO-3 1F1B, 8 micro-batches", 4, ["--set", "parallel.pp=2", "--set", "parallel.dp=2",
                                                      "--set", "parallel.zero_stage=3", "--set", "train.grad_accum=8"]),
    ("tp 2, 8 micro-batches", 2, ["--set", "parallel.tp=2", "--set", "train.grad_accum=8"]),
    ("tp 2 Megatron-SP, 8 micro-batches", 2, ["--set", "parallel.tp=2", "--set", "parallel.megatron_sp=true",
                                              "--set", "train.grad_accum=8"]),
    ("swap, 4 sub-models, 16 GB/s", 0, ["--set", "memory.swap=true", "--set", "memory.device_budget_gb=1",
                                        "--set", "memory.modelled_bandwidth_gbps=16",
                                        "--set", "memory.swap_blocks=[2,2,2,2]"]),
]


def bench(build, nproc, sets):
    cmd = [str(build / "tessera"), "bench", "--config", "tiny_gpt", "--steps", "8", "--warmup", "2", "--json",
           *MODEL, *sets]
    if nproc:
        cmd += ["--nproc", str(nproc), "--out", "/tmp/tessera-regression"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))["median_step_s"]


def main():
    layouts = [layout for layout in LAYOUTS if ARGS.only in layout[0]]
    best, ratios = {}, {}
    for r in range(ROUNDS):
        for name, nproc, sets in layouts:
            step = {}
            for tag, build in (("new", BUILD), ("old", BASELINE)):
                step[tag] = bench(build, nproc, sets)
                best[(name, tag)] = min(best.get((name, tag), step[tag]), step[tag])
                print(f"round {r} {name} {tag} {step[tag]:.4f}", flush=True)
            ratios.setdefault(name, []).append(step["new"] / step["old"])
    only = f" --only '{ARGS.only}'" if ARGS.only else ""
    lines = ["# Training step against a baseline build (CPU)", "",
             f"`bench/regression.py {BUILD} {BASELINE} {ROUNDS}{only}`: tiny_gpt with 8 blocks, n_embd 128, 4 x 128 "
             "tokens per micro-batch, best median step of the rounds, the builds alternating layout by layout; the "
             "paired ratio is this build's median step over the baseline's in the same round.", "",
             "| layout | this build s | baseline s | this / baseline | paired: median (range) |",
             "| --- | --- | --- | --- | --- |"]
    for name, _, _ in layouts:
        new, old = best[(name, "new")], best[(name, "old")]
        r = ratios[name]
        lines.append(f"| {name} | {new:.4f} | {old:.4f} | {new / old:.3f} | "
                     f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) |")
    text = "\n".join(lines) + "\n"
    Path(ARGS.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
