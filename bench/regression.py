#!/usr/bin/env python3
"""Training throughput of this build against another (say, the previous commit's), layout by layout,
in one run: the runners of every kind (plain, data-parallel, pipeline, swapped) on the same model.

Each layout is a `tessera bench --json` run of tiny_gpt widened to 8 blocks (n_embd 128, 4 x 128
tokens per micro-batch, one intra-op thread per process, 8 timed steps after 2 warm-up steps); the
two builds alternate layout by layout for ROUNDS rounds and each keeps its best median step. On this
2-core machine multi-process layouts share the cores, so only the ratio between the builds is the
result. Written to bench/results/regression_cpu.md.

usage: bench/regression.py BUILD_DIR BASELINE_BUILD_DIR [ROUNDS]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD, BASELINE = Path(sys.argv[1]), Path(sys.argv[2])
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
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
    best = {}
    for r in range(ROUNDS):
        for name, nproc, sets in LAYOUTS:
            for tag, build in (("new", BUILD), ("old", BASELINE)):
                s = bench(build, nproc, sets)
                best[(name, tag)] = min(best.get((name, tag), s), s)
                print(f"round {r} {name} {tag} {s:.4f}", flush=True)
    lines = ["# Training step against a baseline build (CPU)", "",
             f"`bench/regression.py {BUILD} {BASELINE} {ROUNDS}`: tiny_gpt with 8 blocks, n_embd 128, 4 x 128 tokens "
             "per micro-batch, best median step of the rounds, the builds alternating layout by layout.", "",
             "| layout | this build s | baseline s | this / baseline |", "| --- | --- | --- | --- |"]
    for name, _, _ in LAYOUTS:
        new, old = best[(name, "new")], best[(name, "old")]
        lines.append(f"| {name} | {new:.4f} | {old:.4f} | {new / old:.3f} |")
    text = "\n".join(lines) + "\n"
    Path("bench/results/regression_cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
