#!/usr/bin/env python3
"""ZeRO-3 inside a pipeline: gathered once per step, or around each action, against ZeRO-2.

Runs `tessera bench --nproc 4` with dp = 2 x pp = 2, interleaved 1F1B with 2 stages per rank and
4 micro-batches, at parallel.zero_stage 2, at 3 (the schedule's GATHER of each stage before its
first action, RELEASE after its last), and at 3 with parallel.zero3_reshard_per_microbatch (a
GATHER before every F and B, a RELEASE after it). It reads every pipeline rank's model state
between steps and peak during a step (the counting allocator), and the dp group's bytes sent per
step by operation. Formulas, for pipeline rank r holding stages c of P_c parameters (fp32),
P_r = sum P_c, over N = 2 replicas, M micro-batches, AdamW:
    model state     ZeRO-2: 4 P_r + (4 + 8) P_r / N      ZeRO-3 (both): (4 + 4 + 8) P_r / N
    all-gather      ZeRO-2 and ZeRO-3 per step: (N-1)/N x 4 P_r bytes sent per rank per step
                    ZeRO-3 per action: (N-1)/N x 4 x 2M x P_r (each stage gathered for its M F's
                    and M B's)
    reduce-scatter  (N-1)/N x 4 P_r per micro-batch (all three)
    whole parameters held at once (ZeRO-3): per step 4 P_r, per action 4 max_c P_c, so the peak
                    falls by about 4 (P_r - max_c P_c) where the activations peak while all the
                    rank's stages were held.
Written to bench/results/pipeline_zero3_cpu.md.

usage: bench/pipeline_zero3.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
M, N, PP = 4, 2, 2
MODEL = ["--set", "parallel.dp=2", "--set", "parallel.pp=2", "--set", "parallel.pp_schedule=interleaved",
         "--set", "model.n_layer=8", "--set", "model.n_embd=128", "--set", "model.n_head=4",
         "--set", "model.block_size=128", "--set", f"train.grad_accum={M}"]
COMMON = ["--config", "tiny_gpt", "--nproc", "4", "--steps", "3", "--warmup", "1", "--json", *MODEL,
          "--set", "train.batch_size=4", "--set", "train.seq_len=128", "--set", "train.threads=1",
          "--out", "/tmp/tessera-pipeline-zero3"]
MODES = [("ZeRO-2", ["--set", "parallel.zero_stage=2"]),
         ("ZeRO-3, gathered per step", ["--set", "parallel.zero_stage=3"]),
         ("ZeRO-3, gathered per action", ["--set", "parallel.zero_stage=3",
                                          "--set", "parallel.zero3_reshard_per_microbatch=true"])]


def bench(extra):
    text = subprocess.run([str(BUILD / "tessera"), "bench", *COMMON, *extra],
                          check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def stage_parameters():
    text = subprocess.run([str(BUILD / "tessera"), "inspect", "--config", "tiny_gpt", "--world", "4", *MODEL],
                          check=True, capture_output=True, text=True).stdout
    return [int(l.split("(")[1].split()[0]) for l in text.splitlines() if l.strip().startswith("stage ")]


def main():
    stages = stage_parameters()  # per stage, the head's copy of wte included
    ranks = [[p for s, p in enumerate(stages) if s % PP == r] for r in range(PP)]  # loop placement
    P = [sum(c) for c in ranks]
    P0 = P[0]  # rank 0 (dp rank 0 of pipeline rank 0) reports the dp traffic
    mib = 1 / 1048576
    rows = []
    for name, extra in MODES:
        r = bench(extra)
        zero2 = name == "ZeRO-2"
        per_action = "action" in name
        state = [(4 * p + 12 * p / N) if zero2 else 16 * p / N for p in P]
        gather = (N - 1) / N * 4 * P0 * (2 * M if per_action else 1)
        held = [0 if zero2 else 4 * (max(c) if per_action else sum(c)) for c in ranks]
        rows.append((name, r, state, gather, held))
        print(name, r["pp_model_state_bytes"], r["pp_peak_bytes"], r["dp_bytes_per_step"], flush=True)
    scatter = (N - 1) / N * 4 * P0 * M
    out = Path("bench/results/pipeline_zero3_cpu.md")
    with out.open("w") as f:
        f.write("# ZeRO-3 inside a pipeline: per step, per action, and ZeRO-2 (CPU, dp 2 x pp 2, 4 processes)\n\n")
        f.write(f"Command: `bench/pipeline_zero3.py {BUILD}` (tiny_gpt widened to n_embd 128, 8 blocks, interleaved "
                f"1F1B with 2 stages per rank, {M} micro-batches of 4 x 128 tokens). Stage parameters: "
                f"{', '.join(str(p) for p in stages)} (the head's copy of wte counted); pipeline rank 0 holds "
                f"stages 0 and 2 (P_0 = {P[0]}), rank 1 stages 1 and 3 (P_1 = {P[1]}). Model state: CPU tensor "
                "bytes live between steps per pipeline rank (dp rank 0 of each); peak: during a step. Traffic: "
                "bytes rank 0 sent over its dp group per step. Formulas in the script's docstring.\n\n")
        f.write("| mode | model state MiB (rank 0, 1) | formula | peak MiB (rank 0, 1) | whole parameters held "
                "at once, formula MiB | all-gather MiB/step (formula) | reduce-scatter MiB/step (formula) |\n"
                "|---|---|---|---|---|---|---|\n")
        for name, r, state, gather, held in rows:
            by_op = r["dp_bytes_per_step"]
            f.write(f"| {name} | {' / '.join(f'{b * mib:.2f}' for b in r['pp_model_state_bytes'])} | "
                    f"{' / '.join(f'{b * mib:.2f}' for b in state)} | "
                    f"{' / '.join(f'{b * mib:.2f}' for b in r['pp_peak_bytes'])} | "
                    f"{' / '.join(f'{b * mib:.2f}' for b in held)} | "
                    f"{by_op.get('all_gather', 0) * mib:.2f} ({gather * mib:.2f}) | "
                    f"{by_op.get('reduce_scatter', 0) * mib:.2f} ({scatter * mib:.2f}) |\n")
        per_step, per_action = rows[1][1]["pp_peak_bytes"], rows[2][1]["pp_peak_bytes"]
        f.write("\nPeak saved by gathering per action: " +
                ", ".join(f"rank {i} {(a - b) * mib:.2f} MiB (at most {(rows[1][4][i] - rows[2][4][i]) * mib:.2f})"
                          for i, (a, b) in enumerate(zip(per_step, per_action))) + ".\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
