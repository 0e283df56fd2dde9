#!/usr/bin/env python3
"""tessera plan against bench/results/atom_slow_links_cpu.md: tiny_gpt on four "hosts" (network
namespaces on this 2-core machine, each host's link limited by tbf), in data parallelism, GPipe,
1F1B, ATOM batch peers (rounds overlapping the local step, the default, and after the backward)
and DiLoCo peers (int8 every 10 local steps), at four link rates.

Each row is predicted from a calibration of this machine for four ranks (`tessera plan calibrate
--ranks 4`: four processes sharing the two cores; the file is written beside the results) with
the links of that row as the table's run measured them before its training runs: a ring
all-reduce of the four hosts (PyTorch's Gloo; its bus bandwidth and latency, the quantities the
cluster file's tiers are) bounds [intra_node] (the four hosts are one node: their compute shares
the cores) and [peers], whose rounds go round the same ring over TCP: each tier takes the lower of
the calibrated bandwidth (loopback, while the ranks compute: what the cores allow) and the link's,
and the longer latency. One number is fitted to
the table itself: [peers].round_overhead_ms, from the unlimited link's row of batch peers with
rounds after the backward (its measured step less the predicted one without it); that cell is
marked and left out of the error. The others check it.

usage: bench/plan_slow_links.py [--tessera build/tessera] [--calibration FILE] [--measured FILE.json]
                                [--round-overhead-ms MS] [--out bench/results/plan_slow_links_cpu.md]

--round-overhead-ms holds the fitted number at another table's fit, so that every cell of this one
checks the model (bench/results/plan_slow_links_heldout_cpu.md).
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
HOSTS, GLOBAL_BATCH, SEQ = 4, 64, 128
MODES = {
    "dp": ["parallel.pp=1", "parallel.tp=1", "parallel.sp=1", "parallel.zero_stage=0", "train.batch_size=16",
           "train.global_batch_size=64", "memory.activation_checkpointing=none", "memory.swap=false", "parallel.offload=false"],
    "gpipe": ["parallel.pp=4", "parallel.tp=1", "parallel.sp=1", "parallel.pp_schedule=gpipe", "parallel.zero_stage=0",
              "train.batch_size=8", "train.global_batch_size=64", "memory.activation_checkpointing=none", "parallel.pp_virtual=0"],
    "1f1b": ["parallel.pp=4", "parallel.tp=1", "parallel.sp=1", "parallel.pp_schedule=1f1b", "parallel.zero_stage=0",
             "train.batch_size=8", "train.global_batch_size=64", "memory.activation_checkpointing=none", "parallel.pp_virtual=0"],
    "batch": ["swarm.sync=batch", "swarm.target_batch_size=64", "train.batch_size=16", "train.global_batch_size=64",
              "memory.activation_checkpointing=none", "memory.swap=false", "swarm.overlap_rounds=always"],
    "batch_after": ["swarm.sync=batch", "swarm.target_batch_size=64", "train.batch_size=16",
                    "train.global_batch_size=64", "memory.activation_checkpointing=none", "memory.swap=false",
                    "swarm.overlap_rounds=never"],
    "diloco": ["swarm.sync=diloco", "swarm.inner_steps=10", "swarm.pseudo_gradient_dtype=int8", "train.batch_size=16",
               "train.global_batch_size=64", "memory.activation_checkpointing=none", "memory.swap=false"],
}
NAMES = {"dp": "data parallelism", "gpipe": "pipeline, GPipe", "1f1b": "pipeline, 1F1B", "batch": "ATOM peers, batch",
         "batch_after": "ATOM batch, rounds after the backward", "diloco": "ATOM peers, DiLoCo int8 / 10 steps"}
FITTED = ("batch_after", "none")


def with_link(calibration, all_reduce, overhead_ms):
    """The calibration with every link tier at the tighter of its calibrated rate (loopback, under the
    ranks' compute: the cores' limit) and the measured all-reduce's bus bandwidth (the link's), and
    the longer of the two latencies."""
    text = calibration
    for tier in ("intra_node", "inter_node", "peers"):
        def tighter(m, measured, pick):
            return m.group(1) + f"{pick(float(m.group(2)), measured):.6g}"
        text = re.sub(rf"(\[{tier}\]\nbandwidth_gbs = )([0-9.]+)",
                      lambda m: tighter(m, all_reduce["bus_mb_per_s"] / 1e3, min), text)
        text = re.sub(rf"(\[{tier}\]\nbandwidth_gbs = [^\n]*\nlatency_us = )([0-9.]+)",
                      lambda m: tighter(m, all_reduce["latency_us"], max), text)
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
    swarm = mode in ("batch", "batch_after", "diloco")
    layout = next(l for l in json.loads(out)["layouts"] if swarm or l["peers"] == 0)
    return layout["tokens_per_s"] / SEQ, layout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--calibration", default="bench/results/plan_slow_links_calibration.toml")
    ap.add_argument("--measured", default=MEASURED)
    ap.add_argument("--round-overhead-ms", type=float,
                    help="[peers].round_overhead_ms as given (fitted on another table), not fitted on this one: "
                         "every cell is then checked")
    ap.add_argument("--out", default="bench/results/plan_slow_links_cpu.md")
    args = ap.parse_args()
    calibration = calibration_text(args.tessera, args.calibration, HOSTS)
    measured = json.load(open(args.measured))
    if "all_reduce" not in measured:
        raise SystemExit(f"{args.measured}: no all_reduce measurement; add it with `python3 bench/atom_slow_links.py "
                         f"BUILD --links-only --out {args.measured[:-5]}` (as root)")
    rows = {(r["mode"], r["rate"]): r["samples_per_s"] for r in measured["results"]}
    modes = [m for m in MODES if any((m, rate) in rows for rate in measured["rates"])]
    with tempfile.TemporaryDirectory() as d:
        def cluster(rate, overhead_ms):
            path = os.path.join(d, f"{rate}.toml")
            open(path, "w").write(with_link(calibration, measured["all_reduce"][rate], overhead_ms))
            return path
        # The round's fixed cost: the fitted row's measured step less the predicted one.
        fitted_cell = FITTED if args.round_overhead_ms is None else None
        if fitted_cell:
            rate0, _ = predict(args.tessera, cluster(FITTED[1], 0), FITTED[0])
            overhead_ms = max(0.0, (GLOBAL_BATCH / rows[FITTED] - GLOBAL_BATCH / rate0) * 1e3)
        else:
            overhead_ms = args.round_overhead_ms
        fit = (f"[peers].round_overhead_ms fitted on the unlimited row of batch rounds after the backward: "
               f"{overhead_ms:.1f} ms" if fitted_cell else
               f"[peers].round_overhead_ms {overhead_ms:.1f} ms as given (fitted on another table): nothing fitted here")
        links = "; ".join(f"{rate} {a['bus_mb_per_s']:.2f} MB/s, {a['latency_us']:.0f} us"
                          for rate, a in measured["all_reduce"].items())
        lines = [f"# tessera plan against the slow-link table ({args.measured[:-5]}.md)", "",
                 "`python3 bench/plan_slow_links.py` (its docstring says what is held and fitted): tiny_gpt on four",
                 "hosts (network namespaces sharing this machine's two cores), each host's link limited by tbf.",
                 "", f"Calibration: {args.calibration} (`tessera plan calibrate --ranks {HOSTS}`); "
                 f"{fit}. The table's runs: {measured['date']} at {measured['commit']}; its links "
                 f"(the four hosts' Gloo all-reduce, bus bandwidth and latency per step{', measured ' + measured['links_measured'] if 'links_measured' in measured else ''}): {links}.", "",
                 "Samples per second, predicted / measured (error):", "",
                 "| link | " + " | ".join(NAMES[m] for m in modes) + " | overlapped / after, predicted | measured |",
                 "|---|" + "---|" * (len(modes) + 2)]
        errors = []
        for rate in measured["rates"]:
            path = cluster(rate, overhead_ms)
            cells, predicted = [], {}
            for mode in modes:
                if (mode, rate) not in rows:
                    cells.append("-")
                    continue
                predicted[mode], _ = predict(args.tessera, path, mode)
                error = predicted[mode] / rows[(mode, rate)] - 1
                fitted = (mode, rate) == fitted_cell
                if not fitted:
                    errors.append(error)
                cells.append(f"{predicted[mode]:.1f} / {rows[(mode, rate)]:.1f} ({error * 100:+.0f}%"
                             f"{', fitted' if fitted else ''})")
            if "batch" in predicted and "batch_after" in predicted:
                cells += [f"{predicted['batch'] / predicted['batch_after']:.2f}",
                          f"{rows[('batch', rate)] / rows[('batch_after', rate)]:.2f}"]
            else:
                cells += ["-", "-"]
            lines.append(f"| {rate} | " + " | ".join(cells) + " |")
        within = sum(1 for e in errors if abs(e) <= 0.15)
        lines += ["", f"Mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, worst "
                  f"{max(errors, key=abs) * 100:+.0f}%, {within} of {len(errors)} within 15%{' (the fitted cell left out)' if fitted_cell else ''}."]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
