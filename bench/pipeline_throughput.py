#!/usr/bin/env python3
"""Training throughput of every pipeline schedule against data parallelism on the same 4 processes.

Runs `tessera bench --nproc 4` (Gloo, CPU) on one model and one global batch per step: pp = 4
with each schedule (8 micro-batches of B sequences), and dp = 4 (2 micro-batches of B sequences
per rank). Reports global tokens per second (median step) and each against dp = 4. On this
machine 4 compute-bound processes share 2 cores, so the ratios, not the absolute rates, are the
result; a pipeline's bubble shows as idle time the other processes fill, which hides part of it.
Written to bench/results/pipeline_throughput_cpu.md.

usage: bench/pipeline_throughput.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
B, T, LAYERS, M = 4, 128, 8, 8
MODEL = ["--set", f"model.n_layer={LAYERS}", "--set", "model.n_embd=128", "--set", "model.n_head=4",
         "--set", f"model.block_size={T}", "--set", f"train.seq_len={T}", "--set", f"train.batch_size={B}",
         "--set", "train.threads=1"]
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev"]


def bench(sets):
    cmd = [str(BUILD / "tessera"), "bench", "--config", "tiny_gpt", "--nproc", "4", "--steps", "5", "--warmup", "2",
           "--json", "--out", "/tmp/tessera-pipeline-throughput", *MODEL, *sets]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def main():
    rows = []
    dp = bench(["--set", "parallel.dp=4", "--set", f"train.grad_accum={M // 4}"])
    dp_rate = dp["tokens_per_s"] * 4  # each rank's own batch
    rows.append(("dp 4 (ZeRO-0)", dp["median_step_s"], dp_rate))
    print("dp4", dp_rate, flush=True)
    for schedule in SCHEDULES:
        r = bench(["--set", "parallel.pp=4", "--set", f"parallel.pp_schedule={schedule}",
                   "--set", f"train.grad_accum={M}"])
        rows.append((f"pp 4, {schedule}", r["median_step_s"], r["tokens_per_s"]))
        print(schedule, r["tokens_per_s"], flush=True)
    out = Path("bench/results/pipeline_throughput_cpu.md")
    with out.open("w") as f:
        f.write("# Pipeline schedules against data parallelism: training throughput (CPU, 4 processes on 2 cores)\n\n")
        f.write(f"Command: `bench/pipeline_throughput.py {BUILD}`. tiny_gpt widened to n_embd 128, {LAYERS} blocks, "
                f"{M} x {B} sequences of {T} tokens per step ({M * B * T} tokens) in every row; median of 5 steps "
                "after 2. Four compute-bound processes share 2 cores, so compare the rows, not the rates.\n\n")
        f.write("| layout | median step s | tokens/s | vs dp 4 |\n|---|---|---|---|\n")
        for name, step, rate in rows:
            f.write(f"| {name} | {step:.3f} | {rate:.0f} | {rate / dp_rate:.2f} |\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
