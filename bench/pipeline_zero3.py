#!/usr/bin/env python3
"""ZeRO-3 inside a pipeline against ZeRO-2: memory per rank and data-parallel traffic per step.

Runs `tessera bench --nproc 4` with dp = 2 x pp = 2 (1F1B, 4 micro-batches) at parallel.zero_stage 2
and 3, and reads every pipeline rank's model state between steps and peak during a step (the
counting allocator) and the dp group's bytes sent per step by operation. ZeRO-3 over a pipeline
stage gathers the stage's units once per pass and keeps them for all its micro-batches (the only
mode built; re-sharding per micro-batch is not), so its traffic equals ZeRO-2's (the all-gather
moves from after the optimizer step to before the first forward) and its saving is the
parameters between steps. Formulas, for a stage of P parameters (fp32) over N = 2 replicas, with
AdamW:
    model state  ZeRO-2: 4P + (4 + 8)P/N        ZeRO-3: (4 + 4 + 8)P/N
    all-gather   (N-1)/N x 4P bytes sent per rank per step (both)
    reduce-scatter (N-1)/N x 4P per micro-batch (both)
Written to bench/results/pipeline_zero3_cpu.md.

usage: bench/pipeline_zero3.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
M, N = 4, 2
COMMON = ["--config", "tiny_gpt", "--nproc", "4", "--steps", "3", "--warmup", "1", "--json",
          "--set", "parallel.dp=2", "--set", "parallel.pp=2", "--set", "model.n_layer=8", "--set", "model.n_embd=128",
          "--set", "model.n_head=4", "--set", "train.batch_size=4", "--set", "train.seq_len=128",
          "--set", "model.block_size=128", "--set", "train.threads=1", "--set", f"train.grad_accum={M}",
          "--out", "/tmp/tessera-pipeline-zero3"]


def bench(stage):
    text = subprocess.run([str(BUILD / "tessera"), "bench", *COMMON, "--set", f"parallel.zero_stage={stage}"],
                          check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def stage_parameters():
    text = subprocess.run([str(BUILD / "tessera"), "inspect", "--config", "tiny_gpt", "--world", "4",
                           "--set", "parallel.dp=2", "--set", "parallel.pp=2", "--set", "model.n_layer=8",
                           "--set", "model.n_embd=128", "--set", "model.n_head=4", "--set", "model.block_size=128",
                           "--set", f"train.grad_accum={M}"], check=True, capture_output=True, text=True).stdout
    return [int(l.split("(")[1].split()[0]) for l in text.splitlines() if l.strip().startswith("stage ")]


def main():
    params = stage_parameters()  # per stage, the head's copy of wte included
    P0 = params[0]  # rank 0 (dp rank 0 of stage 0) reports the dp traffic
    mib = 1 / 1048576
    rows = []
    for stage in (2, 3):
        r = bench(stage)
        state_formula = [(4 * p + 12 * p / N) if stage == 2 else 16 * p / N for p in params]
        by_op = r["dp_bytes_per_step"]
        rows.append((stage, r, state_formula, by_op))
        print(stage, r["pp_model_state_bytes"], r["pp_peak_bytes"], by_op, flush=True)
    gather_formula = (N - 1) / N * 4 * P0
    scatter_formula = (N - 1) / N * 4 * P0 * M
    out = Path("bench/results/pipeline_zero3_cpu.md")
    with out.open("w") as f:
        f.write("# ZeRO-3 inside a pipeline against ZeRO-2 (CPU, dp 2 x pp 2, 4 processes)\n\n")
        f.write(f"Command: `bench/pipeline_zero3.py {BUILD}` (tiny_gpt widened to n_embd 128, 8 blocks, 1F1B, {M} "
                f"micro-batches of 4 x 128 tokens). Stage parameters P: {params[0]} and {params[1]} (the head's "
                "copy of wte counted). Model state: CPU tensor bytes live between steps per pipeline rank (dp rank 0 "
                "of each stage); peak: during a step. Traffic: bytes rank 0 sent over its dp group per step.\n\n")
        f.write("| ZeRO | model state MiB (stage 0, 1) | formula MiB | peak MiB (stage 0, 1) | all-gather MiB/step "
                "(formula) | reduce-scatter MiB/step (formula) |\n|---|---|---|---|---|---|\n")
        for stage, r, state_formula, by_op in rows:
            f.write(f"| {stage} | {' / '.join(f'{b * mib:.2f}' for b in r['pp_model_state_bytes'])} | "
                    f"{' / '.join(f'{b * mib:.2f}' for b in state_formula)} | "
                    f"{' / '.join(f'{b * mib:.2f}' for b in r['pp_peak_bytes'])} | "
                    f"{by_op.get('all_gather', 0) * mib:.2f} ({gather_formula * mib:.2f}) | "
                    f"{by_op.get('reduce_scatter', 0) * mib:.2f} ({scatter_formula * mib:.2f}) |\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
