#!/usr/bin/env python3
"""tessera plan's peak memory against measurement on this machine: for each layout of
bench/plan_runs_here.py, the plan's peak_memory_gib (the memory estimate of its largest rank) against
`tessera bench`'s peak_bytes: the most CPU tensor bytes live at once during its timed steps
(memory/host_memory_stats.h: every storage libtorch allocates, counted by the CPU allocator; the
baseline before the model is built subtracted), on rank 0, or the largest pipeline rank.

Tensor bytes are what the estimate models and what the CUDA caching allocator's peak counts on a GPU;
the process's resident set adds libtorch, the threads and glibc's heap on top, which
bench/plan_runs_here.py compares with a fixed overhead.

usage: bench/plan_memory_here.py [--tessera build/tessera] [--out bench/results/plan_memory_here_cpu.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_runs_here import LAYOUTS, MODEL, full_layout, run, sets  # noqa: E402

CLUSTER = "clusters/this_machine_2core.toml"
MiB = 1024.0 * 1024.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default="build/tessera")
    parser.add_argument("--out", default="bench/results/plan_memory_here_cpu.md")
    parser.add_argument("--only", default="", help="run the layouts whose name contains this")
    a = parser.parse_args()
    rows, errors = [], []
    for name, world, keys in LAYOUTS:
        if a.only and a.only not in name:
            continue
        common = sets(MODEL + full_layout(keys))
        plan = json.loads(run([a.tessera, "plan", "--config", "tiny_gpt", "--cluster", CLUSTER, "--world", str(world),
                               "--json", "--top", "1"] + common))["layouts"][0]
        bench = [a.tessera, "bench", "--config", "tiny_gpt", "--json", "--warmup", "2", "--steps", "2"] + common
        if world > 1:
            bench += ["--nproc", str(world), "--out", "/tmp/plan_memory_here"]
        measured = json.loads(run(bench).strip().splitlines()[-1])
        peak = max(measured.get("pp_peak_bytes") or [measured["peak_bytes"]])
        predicted = plan["peak_memory_gib"] * 1024 * MiB
        error = predicted / peak - 1
        errors.append(abs(error))
        rows.append(f"| {name} | {world} | {predicted / MiB:.1f} | {peak / MiB:.1f} | {100 * error:+.1f}% | "
                    f"{measured['model_state_bytes'] / MiB:.1f} |")
        print(rows[-1], flush=True)
    summary = (f"mean absolute error {100 * statistics.mean(errors):.1f}%, worst {100 * max(errors):.1f}%, "
               f"within 5%: {sum(e <= 0.05 for e in errors)} of {len(errors)}")
    print(summary)
    if not a.only:
        with open(a.out, "w") as f:
            f.write("# tessera plan's peak memory against tensor bytes measured on this machine\n\n"
                    "`python3 bench/plan_memory_here.py` (its docstring says what is compared). Model: 4 blocks of "
                    "width 256, 8 heads, sequences of 128, global batch 16, AdamW, fp32.\n\n"
                    "| layout | ranks | predicted peak MiB | measured peak MiB | error | measured model state MiB |\n"
                    "|---|---|---|---|---|---|\n")
            f.write("\n".join(rows) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
