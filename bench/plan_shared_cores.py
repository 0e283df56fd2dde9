#!/usr/bin/env python3
"""tessera plan's pipelines on shared cores (src/plan/shared_cores.h) against runs: four ranks of
tiny_gpt on this 2-core machine's loopback (no link limit), data parallelism, pp 2 x dp 2 and pp 4,
each pipeline under GPipe and 1F1B, 64 sequences of 128 tokens a step.

Each layout is predicted from the four-rank calibration of the slow-link table
(bench/results/plan_slow_links_calibration.toml, `tessera plan calibrate --ranks 4`) with every key
held, then run by `tessera bench --nproc 4` (the median step of --steps after --warmup). Nothing is
fitted to these runs; the replay's replicas (world / pp) were added before they were measured.

usage: bench/plan_shared_cores.py [--tessera build/tessera] [--calibration FILE] [--steps 12]
                                  [--out bench/results/plan_shared_cores_cpu.md]
"""
import argparse
import json
import os
import subprocess

from results_file import write_results
from tessera_bench import tessera_bench

COMMON = {"train.threads": 1, "train.seq_len": 128, "train.global_batch_size": 64, "parallel.tp": 1,
          "parallel.sp": 1, "parallel.zero_stage": 0, "parallel.megatron_sp": "false", "parallel.offload": "false",
          "memory.activation_checkpointing": "none", "memory.swap": "false"}
LAYOUTS = [
    ("dp4", {"parallel.pp": 1, "train.batch_size": 16}),
    ("pp2 x dp2 GPipe", {"parallel.pp": 2, "parallel.pp_schedule": "gpipe", "parallel.pp_virtual": 1,
                          "train.batch_size": 8}),
    ("pp2 x dp2 1F1B", {"parallel.pp": 2, "parallel.pp_schedule": "1f1b", "parallel.pp_virtual": 1,
                         "train.batch_size": 8}),
    ("pp4 GPipe", {"parallel.pp": 4, "parallel.pp_schedule": "gpipe", "parallel.pp_virtual": 1, "train.batch_size": 8}),
    ("pp4 1F1B", {"parallel.pp": 4, "parallel.pp_schedule": "1f1b", "parallel.pp_virtual": 1, "train.batch_size": 8}),
]


def predict(tessera, calibration, sets):
    cmd = [tessera, "plan", "--config", "tiny_gpt", "--cluster", calibration, "--world", "4", "--json", "--top", "1"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["layouts"][0]["step_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--calibration", default="bench/results/plan_slow_links_calibration.toml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default="bench/results/plan_shared_cores_cpu.md")
    a = ap.parse_args()
    rows, errors = [], []
    for name, keys in LAYOUTS:
        sets = {**COMMON, **keys}
        predicted = predict(a.tessera, a.calibration, sets)
        measured = tessera_bench(os.path.dirname(a.tessera), "tiny_gpt", sets, ranks=4, steps=a.steps,
                                 warmup=3)["median_step_s"]
        errors.append(predicted / measured - 1)
        rows.append(f"| {name} | {predicted * 1e3:.0f} | {measured * 1e3:.0f} | {errors[-1] * 100:+.1f}% |")
        print(rows[-1], flush=True)
    lines = ["# Pipelines on shared cores: tessera plan against four ranks on two cores", "",
             f"`python3 bench/plan_shared_cores.py --steps {a.steps}` (its docstring says what is held); calibration "
             f"{a.calibration}.", "",
             "| layout | predicted step ms | measured median ms | error |", "|---|---|---|---|"] + rows
    lines += ["", f"Mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, worst "
              f"{max(errors, key=abs) * 100:+.1f}%."]
    write_results(a.out, lines)


if __name__ == "__main__":
    main()
