#!/usr/bin/env python3
"""tessera plan against this project's own GPU runs: GPT-2 124M, bf16, sequence 1024, one card
(bench/results/train_step_{h100,h200}_gpt2_124m_1024_bf16_b{B}_{build}.json, `tessera bench` steps
measured by bench/compare_pytorch.py on lent H100 and H200 machines).

Each run is predicted from its card's preset (clusters/dgx_h100.toml for the H100, clusters/h200.toml)
for the layout it ran: one process, no checkpointing, its batch as one micro-batch. What calibrated
the presets: only their attention_tflops_bf16, from the batch-16 traces of bench/results/
gpu_first_runs.md (the attention kernels' 3.7 / 3.6 ms); the product rate is a public measurement
(stas00/ml-engineering's MAMF table) and the rest datasheets and assumptions, each named in the file.
No step time below went into them.

Runs of builds before cefc18b (session 28's fused layer norm and cross-entropy) ran kernels the
current code no longer runs, and session 49's (507e23c) ran the q/k/v narrows' backward since
replaced; they are listed, marked, and left out of the error summary.

A second table predicts the H200 swap and offload runs of bench/results/gpu_refactor_h200.md
(GPT-2 124M, bf16, batch 8, scripts/gpu_lease.sh's `swap` part): the h200 preset's
host.optimizer_gbs was set from one of them (the swapped run with clipping: its host update, 45.7
ms), which is listed and left out of that table's error; the others check it.

usage: bench/plan_gpu_runs.py [--tessera build/tessera] [--out bench/results/plan_gpu_runs.md]
"""
import argparse
import glob
import json
import re
import subprocess

from results_file import write_results

CURRENT = {"cefc18b"}  # the builds whose kernels the current code runs (session 28 on)
# Later builds whose step ran work the current code no longer runs: listed with the reason, left out
# of the error summary.
OTHER_WORK = {"507e23c": "q/k/v narrows' backward, 2.0 ms at batch 16; split since"}
PRESET = {"h100": "dgx_h100", "h200": "h200"}


def predict(binary, card, batch):
    out = subprocess.run(
        [binary, "plan", "--config", "gpt2_124m", "--cluster", PRESET[card], "--world", "1",
         "--set", f"train.batch_size={batch}", "--set", "train.seq_len=1024", "--set", "train.grad_accum=1",
         "--set", "parallel.zero_stage=0", "--set", "memory.activation_checkpointing=none",
         "--set", "precision.dtype=bf16", "--top", "1", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["layouts"][0]


# bench/results/gpu_refactor_h200.md, "swap and offload": the median steps (ms) and the keys each run set
# beyond the common ones (scripts/gpu_lease.sh).
HOST_RUNS = [
    ("resident", 21.9, []),
    ("swap, clipping (calibrates host.optimizer_gbs)", 116.6, ["memory.swap=true", "memory.device_budget_gb=3.5"]),
    ("swap, no clipping", 85.6, ["memory.swap=true", "memory.device_budget_gb=3.5", "optim.grad_clip=0"]),
    ("ZeRO-3 + offload, clipping", 106.6, ["parallel.zero_stage=3", "parallel.offload=true"]),
    ("ZeRO-3 + offload, no clipping", 107.4, ["parallel.zero_stage=3", "parallel.offload=true", "optim.grad_clip=0"]),
    ("ZeRO-2 + offload", 101.5, ["parallel.zero_stage=2", "parallel.offload=true"]),
]


def predict_host_run(binary, sets):
    common = ["model.preset=gpt2_124m", "train.seq_len=1024", "train.device=cuda", "precision.dtype=bf16",
              "optim.name=adamw", "optim.fused=true", "optim.grad_clip=1.0", "train.batch_size=8", "train.grad_accum=1",
              "memory.activation_checkpointing=none", "parallel.zero_stage=0", "parallel.offload=false", "memory.swap=false"]
    args = [binary, "plan", "--config", "tiny_gpt", "--cluster", "h200", "--world", "1", "--top", "1", "--json"]
    for kv in common + sets:
        args += ["--set", kv]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)["layouts"][0]


def host_table(binary):
    lines = ["", "## Swap and offload on the H200 (bench/results/gpu_refactor_h200.md)", "",
             "GPT-2 124M, bf16, batch 8 x 1024, one process. `host` is the swap engine's loads, stores and host",
             "updates beyond the compute (swap) or the offload copies and the host's optimizer step.", "",
             "| run | measured ms | predicted ms | error | compute | host |", "|---|---|---|---|---|---|"]
    errors = []
    for name, measured, sets in HOST_RUNS:
        p = predict_host_run(binary, sets)
        b = p["breakdown"]
        compute = sum(b[k] for k in ("products", "attention", "memory_bound"))
        host = b.get("swap_link_and_host", 0) + b.get("offload_copies", 0) + b.get("optimizer", 0)
        error = p["step_s"] * 1e3 / measured - 1
        if "calibrates" not in name:
            errors.append(error)
        lines.append(f"| {name} | {measured:.1f} | {p['step_s'] * 1e3:.1f} | {error * 100:+.1f}% | {compute * 1e3:.1f} | "
                     f"{host * 1e3:.1f} |")
    lines += ["", f"The runs that set nothing: mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, "
              f"worst {max(errors, key=abs) * 100:+.1f}% ({len(errors)} runs)."]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--out", default="bench/results/plan_gpu_runs.md")
    args = ap.parse_args()
    rows = []
    for path in sorted(glob.glob("bench/results/train_step_h*_gpt2_124m_1024_bf16_b*.json")):
        m = re.search(r"train_step_(h100|h200)_gpt2_124m_1024_bf16_b(\d+)_([0-9a-f]+)(_first)?\.json", path)
        if not m or m.group(4):
            continue
        card, batch, build = m.group(1), int(m.group(2)), m.group(3)
        measured = next(r for r in json.load(open(path)) if r.get("peer") == "tessera")["median_step_s"]
        p = predict(args.tessera, card, batch)
        rows.append((card, build, batch, measured, p))
    lines = ["# tessera plan against this project's GPU runs (GPT-2 124M, bf16, sequence 1024, one card)", "",
             f"`python3 bench/plan_gpu_runs.py` ({__doc__.splitlines()[0]}). Predicted from the card's preset;",
             "the presets' only number taken from this project's runs is attention_tflops_bf16 (the batch-16",
             "traces); no step time below calibrated anything.", "",
             "| card | build | batch | measured step ms | predicted ms | error | products | attention | memory-bound | optimizer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for card, build, batch, measured, p in sorted(rows, key=lambda r: (r[0], r[1] not in CURRENT, r[1], r[2])):
        error = p["step_s"] / measured - 1
        current = build in CURRENT
        if current:
            errors.append(error)
        b = p["breakdown"]
        label = "" if current else f" ({OTHER_WORK[build]})" if build in OTHER_WORK else " (older kernels)"
        lines.append(f"| {card.upper()} | {build}{label} | {batch} | {measured * 1e3:.1f} | "
                     f"{p['step_s'] * 1e3:.1f} | {error * 100:+.1f}% | {b['products'] * 1e3:.1f} | {b['attention'] * 1e3:.1f} | "
                     f"{b['memory_bound'] * 1e3:.1f} | {b['optimizer'] * 1e3:.1f} |")
    lines += ["", f"Runs of the current kernels: mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, "
              f"worst {max(errors, key=abs) * 100:+.1f}% ({len(errors)} runs)."]
    lines += host_table(args.tessera)
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
