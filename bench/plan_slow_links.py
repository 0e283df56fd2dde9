#!/usr/bin/env python3
"""tessera plan against bench/results/atom_slow_links_cpu.md: tiny_gpt on four "hosts" (network
namespaces on this 2-core machine, each host's link limited by tbf), in data parallelism, GPipe,
1F1B, ATOM batch peers and DiLoCo peers (int8 every 10 local steps), at four link rates.

Each row is predicted from a calibration of this machine for four ranks (`tessera plan calibrate
--ranks 4`: four processes sharing the two cores; the file is written beside the results) with
the link of that row: the rate the table's run measured one host receiving from another goes into
[intra_node] (the four hosts are one node: their compute shares the cores) and [peers]. One
number is fitted to the table itself: [peers].round_overhead_ms, from the unlimited link's batch
row (its measured step less the predicted one without it); that row is listed, marked, and left out
of the error. The others check it. That table's batch peers ran their rounds after the backward
(before swarm.overlap_rounds), so they are predicted with swarm.overlap_rounds = never.

A second table checks the overlapped rounds (swarm.overlap_rounds = always, the default) against
bench/results/swarm_overlap_slow_links_cpu.json (bench/atom_slow_links.py --modes
dp,batch,batch_after at 1 Gbit, 100 and 10 Mbit), with the same calibration and fitted cost:
nothing in it was fitted to those runs.

usage: bench/plan_slow_links.py [--tessera build/tessera] [--calibration FILE] [--out bench/results/plan_slow_links_cpu.md]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

from results_file import write_results
from tessera_bench import calibration_text

MEASURED = "bench/results/atom_slow_links_cpu.json"
OVERLAP_MEASURED = "bench/results/swarm_overlap_slow_links_cpu.json"
HOSTS, GLOBAL_BATCH, SEQ = 4, 64, 128
MODES = {
    "dp": ["parallel.pp=1", "parallel.tp=1", "parallel.sp=1", "parallel.zero_stage=0", "train.batch_size=16",
           "train.global_batch_size=64", "memory.activation_checkpointing=none", "memory.swap=false", "parallel.offload=false"],
    "gpipe": ["parallel.pp=4", "parallel.tp=1", "parallel.sp=1", "parallel.pp_schedule=gpipe", "parallel.zero_stage=0",
              "train.batch_size=8", "train.global_batch_size=64", "memory.activation_checkpointing=none", "parallel.pp_virtual=0"],
    "1f1b": ["parallel.pp=4", "parallel.tp=1", "parallel.sp=1", "parallel.pp_schedule=1f1b", "parallel.zero_stage=0",
             "train.batch_size=8", "train.global_batch_size=64", "memory.activation_checkpointing=none", "parallel.pp_virtual=0"],
    "batch": ["swarm.sync=batch", "swarm.target_batch_size=64", "train.batch_size=16", "train.global_batch_size=64",
              "memory.activation_checkpointing=none", "memory.swap=false", "swarm.overlap_rounds=never"],
    "diloco": ["swarm.sync=diloco", "swarm.inner_steps=10", "swarm.pseudo_gradient_dtype=int8", "train.batch_size=16",
               "train.global_batch_size=64", "memory.activation_checkpointing=none", "memory.swap=false"],
}
NAMES = {"dp": "data parallelism", "gpipe": "pipeline, GPipe", "1f1b": "pipeline, 1F1B", "batch": "ATOM peers, batch",
         "diloco": "ATOM peers, DiLoCo int8 / 10 steps"}


def with_link(calibration, gbs, overhead_ms):
    text = re.sub(r"(\[intra_node\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{gbs:.6g}", calibration)
    text = re.sub(r"(\[inter_node\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{gbs:.6g}", text)
    text = re.sub(r"(\[peers\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{gbs:.6g}", text)
    return re.sub(r"round_overhead_ms = [0-9.]+", f"round_overhead_ms = {overhead_ms:.4f}", text)


def predict(binary, cluster, mode, replacing=()):
    """The mode's best layout, with `replacing`'s key=value settings in place of the mode's own. The
    modes that are not swarms take the best layout without peers (data parallelism's held keys
    leave batch peers in the search, and where they are faster they came first)."""
    args = [binary, "plan", "--config", "tiny_gpt", "--cluster", cluster, "--world", str(HOSTS), "--top", "20", "--json",
            "--set", "train.threads=1", "--set", f"train.seq_len={SEQ}"]
    keys = {kv.split("=")[0] for kv in replacing}
    for kv in [kv for kv in MODES[mode] if kv.split("=")[0] not in keys] + list(replacing):
        args += ["--set", kv]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    swarm = mode in ("batch", "diloco")
    layout = next(l for l in json.loads(out)["layouts"] if swarm or l["peers"] == 0)
    return layout["tokens_per_s"] / SEQ, layout


def overlap_table(binary, calibration, overhead_ms, directory):
    """Batch peers with rounds overlapping the local step and after it, against the runs of both."""
    measured = json.load(open(OVERLAP_MEASURED))
    rows = {(r["mode"], r["rate"]): r["samples_per_s"] for r in measured["results"]}
    lines = ["", f"## Overlapped rounds (held out: {OVERLAP_MEASURED}, {measured['date']} at {measured['commit']})", "",
             "Samples per second, predicted / measured (error); the last columns the overlapped rounds over the",
             "rounds after the backward:", "",
             "| link | batch, overlapped | batch, after the backward | data parallelism | overlapped / after, predicted | measured |",
             "|---|---|---|---|---|---|"]
    for rate in measured["rates"]:
        path = os.path.join(directory, f"overlap_{rate}.toml")
        open(path, "w").write(with_link(calibration, measured["links_mb_per_s"][rate] / 1e3, overhead_ms))
        cells, predicted = [], {}
        for mode, sets in (("batch", ["swarm.overlap_rounds=always"]), ("batch_after", []), ("dp", [])):
            predicted[mode], _ = predict(binary, path, "batch" if mode != "dp" else "dp", sets)
            got = rows[(mode, rate)]
            cells.append(f"{predicted[mode]:.1f} / {got:.1f} ({(predicted[mode] / got - 1) * 100:+.0f}%)")
        ratio = predicted["batch"] / predicted["batch_after"]
        cells += [f"{ratio:.2f}", f"{rows[('batch', rate)] / rows[('batch_after', rate)]:.2f}"]
        lines.append(f"| {rate} | " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--calibration", default="bench/results/plan_slow_links_calibration.toml")
    ap.add_argument("--out", default="bench/results/plan_slow_links_cpu.md")
    args = ap.parse_args()
    calibration = calibration_text(args.tessera, args.calibration, HOSTS)
    measured = json.load(open(MEASURED))
    rows = {(r["mode"], r["rate"]): r["samples_per_s"] for r in measured["results"]}
    with tempfile.TemporaryDirectory() as d:
        def cluster(rate, overhead_ms):
            path = os.path.join(d, f"{rate}.toml")
            open(path, "w").write(with_link(calibration, measured["links_mb_per_s"][rate] / 1e3, overhead_ms))
            return path
        # The round's fixed cost: the unlimited batch row's measured step less the predicted one.
        rate0, _ = predict(args.tessera, cluster("none", 0), "batch")
        overhead_ms = max(0.0, (GLOBAL_BATCH / rows[("batch", "none")] - GLOBAL_BATCH / rate0) * 1e3)
        lines = ["# tessera plan against the slow-link table (bench/results/atom_slow_links_cpu.md)", "",
                 "`python3 bench/plan_slow_links.py` (its docstring says what is held and fitted): tiny_gpt on four",
                 "hosts (network namespaces sharing this machine's two cores), each host's link limited by tbf.",
                 "", f"Calibration: {args.calibration} (`tessera plan calibrate --ranks {HOSTS}`); "
                 f"[peers].round_overhead_ms fitted on the unlimited batch row: {overhead_ms:.1f} ms. "
                 f"The table's runs: {measured['date']} at {measured['commit']}.", "",
                 "Samples per second, predicted / measured (error):", "",
                 "| link | " + " | ".join(NAMES[m] for m in MODES) + " |", "|---|" + "---|" * len(MODES)]
        errors = []
        for rate in measured["rates"]:
            path = cluster(rate, overhead_ms)
            cells = []
            for mode in MODES:
                if (mode, rate) not in rows:
                    cells.append("-")
                    continue
                predicted, _ = predict(args.tessera, path, mode)
                error = predicted / rows[(mode, rate)] - 1
                fitted = mode == "batch" and rate == "none"
                if not fitted:
                    errors.append(error)
                cells.append(f"{predicted:.1f} / {rows[(mode, rate)]:.1f} ({error * 100:+.0f}%{', fitted' if fitted else ''})")
            lines.append(f"| {rate} | " + " | ".join(cells) + " |")
        within = sum(1 for e in errors if abs(e) <= 0.15)
        lines += ["", f"Mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, worst "
                  f"{max(errors, key=abs) * 100:+.0f}%, {within} of {len(errors)} within 15% (the fitted row left out)."]
        lines += overlap_table(args.tessera, calibration, overhead_ms, d)
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
