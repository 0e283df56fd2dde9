#!/usr/bin/env python3
"""ATOM swapping (memory.swap) on the CPU "device", against resident training and ZeRO-3 offload.

Three measurements, each a `tessera bench` run (median of the timed steps after a warm-up), one
process, compute on one thread (train.threads = 1) so the swap engine's copy and optimizer
threads have the second core:

  sweep    a GPT of 8 blocks (n_embd 256, 2 x 64 tokens per step): step time swapped at modelled
           link bandwidths of 1 to 64 GB/s against the same model resident, and against the swap
           plan's prediction (the replay of the plan with the measured block costs); the exposed
           load measured and predicted.
  largest  the largest model this machine trains swapped with a device budget of 1 GiB: its
           training state (float32 masters, gradients, AdamW moments) at least 10x the budget;
           tokens/s swapped and resident (the CPU holds the resident model too).
  copies   the sweep model in bf16 at a 1 GB/s link: LOADs of fp32 copies against bf16 copies
           (memory.swap_copies), and the model resident
  offload  the sweep model swapped (16 GB/s) against tessera's own ZeRO-3 with parallel.offload
           on one process: on a CPU "device" ZeRO-Offload's copies are plain memcpy, not held to
           the modelled link, which favours it.
  evaluation  the sweep model's validation (8 batches) swapped at a 0.5 GB/s link against resident:
           the seconds of each evaluation (metrics.jsonl eval_s) over 6 steps evaluating after each;
           a swapped evaluation loads each sub-model once, the next while the current computes.

Written to bench/results/swap_cpu.md.

usage: bench/swap.py [BUILD_DIR] [sweep|largest|copies|offload|evaluation|all]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
PART = sys.argv[2] if len(sys.argv) > 2 else "all"
SWEEP = ["model.n_layer=8", "model.n_embd=256", "model.n_head=4", "train.batch_size=2", "train.seq_len=64",
         "train.threads=1"]
SWAP = ["memory.swap=true", "memory.device_budget_gb=0.5"]
LARGEST = ["model.n_layer=14", "model.n_embd=2048", "model.n_head=16", "train.batch_size=1", "train.seq_len=64",
           "model.block_size=64", "memory.activation_checkpointing=full", "train.threads=1"]


def bench(sets, steps=8, nproc=0):
    args = [str(BUILD / "tessera"), "bench", "--config", "tiny_gpt", "--steps", str(steps), "--warmup", "1", "--json"]
    if nproc:
        args += ["--nproc", str(nproc), "--out", "/tmp/tessera-bench-swap"]
    for s in sets:
        args += ["--set", s]
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def sweep(f):
    resident = bench(SWEEP)
    f.write(f"## Bandwidth sweep\n\nCommand: `bench/swap.py {BUILD} sweep`. ")
    f.write(f"Model: tiny_gpt with {', '.join(SWEEP)} ({resident['parameters'] / 1e6:.2f}M parameters); swapped with "
            f"{', '.join(SWAP)}. Resident: {1000 * resident['median_step_s']:.1f} ms per step.\n\n")
    f.write("| link GB/s | sub-models (boundaries) | swapped ms | vs resident | predicted ms | load ms | exposed load "
            "measured / predicted ms |\n|---|---|---|---|---|---|---|\n")
    threshold = None
    for gbps in (1, 2, 4, 8, 16, 32, 64):
        r = bench(SWEEP + SWAP + [f"memory.modelled_bandwidth_gbps={gbps}"])
        s = r["swap"]
        ratio = r["median_step_s"] / resident["median_step_s"]
        if threshold is None and ratio < 1.05:
            threshold = gbps
        f.write(f"| {gbps} | {len(s['boundaries']) - 1} ({s['boundaries']}) | {1000 * r['median_step_s']:.1f} | "
                f"{ratio:.3f} | {1000 * s['predicted_step_s']:.1f} | {1000 * s['load_s']:.1f} | "
                f"{1000 * s['measured_exposed_load_s']:.2f} / {1000 * s['predicted_exposed_load_s']:.2f} |\n")
        print(gbps, r["median_step_s"], ratio, s, flush=True)
    f.write(f"\nSwapping costs under 5% from {threshold} GB/s on (the lowest bandwidth measured with a ratio "
            "below 1.05).\n\n" if threshold else "\nNo bandwidth measured kept swapping under 5%.\n\n")


def largest(f):
    swapped = bench(LARGEST + ["memory.swap=true", "memory.device_budget_gb=1", "memory.modelled_bandwidth_gbps=16"],
                    steps=3)
    state = swapped["parameters"] * 16  # float32 master + gradient + AdamW's two moments
    f.write(f"## The largest model with a 1 GiB device budget\n\nCommand: `bench/swap.py {BUILD} largest`. ")
    f.write(f"Model: tiny_gpt with {', '.join(LARGEST)}: {swapped['parameters'] / 1e6:.0f}M parameters, training "
            f"state {state / 2**30:.1f} GiB = {state / 2**30:.1f}x the 1 GiB budget (16 bytes per parameter); swapped "
            f"with memory.device_budget_gb=1, memory.modelled_bandwidth_gbps=16; {len(swapped['swap']['boundaries']) - 1}"
            f" sub-models, planned device peak {swapped['swap']['planned_device_peak_bytes'] / 2**20:.0f} MiB, host "
            f"memory predicted {swapped['swap']['host_bytes'] / 2**30:.1f} GiB.\n\n")
    print("swapped", swapped, flush=True)
    resident = bench(LARGEST, steps=3)
    print("resident", resident, flush=True)
    f.write("The host optimizer runs on the swap engine's host thread, whose OpenMP team is the default (both "
            "cores), while train.threads = 1 holds the resident run's optimizer to one: part of the swapped run's "
            "lead is that, part is the resident run allocating its 2.8 GB of gradients afresh each step.\n\n")
    f.write("| run | step s | tokens/s | vs resident |\n|---|---|---|---|\n")
    for name, r in (("resident", resident), ("swapped", swapped)):
        f.write(f"| {name} | {r['median_step_s']:.2f} | {r['tokens_per_s']:.1f} | "
                f"{r['tokens_per_s'] / resident['tokens_per_s']:.2f} |\n")
    f.write("\n")


def copies(f):
    bf16 = SWEEP + ["precision.dtype=bf16"]
    resident = bench(bf16)
    f.write(f"## bf16 copies on the link\n\nCommand: `bench/swap.py {BUILD} copies`. Model: the sweep's in "
            f"precision.dtype=bf16, swapped with {', '.join(SWAP)} at a 1 GB/s modelled link; resident "
            f"{1000 * resident['median_step_s']:.1f} ms per step.\n\n")
    f.write("| memory.swap_copies | cut | step ms | vs resident | predicted ms | load ms | exposed load measured / "
            "predicted ms |\n|---|---|---|---|---|---|---|\n")
    for kind in ("fp32", "bf16"):
        r = bench(bf16 + SWAP + ["memory.modelled_bandwidth_gbps=1", f"memory.swap_copies={kind}"])
        s = r["swap"]
        f.write(f"| {kind} | {s['boundaries']} | {1000 * r['median_step_s']:.1f} | "
                f"{r['median_step_s'] / resident['median_step_s']:.2f} | {1000 * s['predicted_step_s']:.1f} | "
                f"{1000 * s['load_s']:.1f} | {1000 * s['measured_exposed_load_s']:.2f} / "
                f"{1000 * s['predicted_exposed_load_s']:.2f} |\n")
        print(kind, r["median_step_s"], s, flush=True)
    f.write("\n")


def offload(f):
    swapped = bench(SWEEP + SWAP + ["memory.modelled_bandwidth_gbps=16"])
    zero3 = bench(SWEEP + ["parallel.zero_stage=3", "parallel.offload=true"], nproc=1)
    f.write(f"## Against ZeRO-3 with offload (one process)\n\nCommand: `bench/swap.py {BUILD} offload`. ")
    f.write(f"Model: the sweep's. Swapped at 16 GB/s modelled; ZeRO-3 + parallel.offload on `--nproc 1` (its "
            "copies unthrottled).\n\n| run | step ms | tokens/s |\n|---|---|---|\n")
    for name, r in (("swapped (memory.swap)", swapped), ("ZeRO-3 + offload", zero3)):
        f.write(f"| {name} | {1000 * r['median_step_s']:.1f} | {r['tokens_per_s']:.0f} |\n")
    f.write("\n")
    print("offload", zero3["median_step_s"], "swapped", swapped["median_step_s"], flush=True)


def evaluations(sets):
    """Median seconds of one evaluation in a 6-step `tessera train` evaluating after every step."""
    out, data = "/tmp/tessera-bench-swap-eval", BUILD / "data/kjv"
    if not (data / "val.bin").exists():  # as `make train` prepares it
        subprocess.run([str(BUILD / "tessera"), "prepare", "--input", "data/kjv/genesis_to_ruth.txt", "--out",
                        str(data), "--tokenizer", "byte"], check=True, capture_output=True)
    args = [str(BUILD / "tessera"), "train", "--config", "tiny_gpt", "--out", out, "--overwrite"]
    for s in sets + [f"data.path={data}", "train.steps=6", "eval.every=1", "eval.batches=8",
                     "checkpoint.every=0"]:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True, text=True)
    lines = [json.loads(l) for l in Path(out, "metrics.jsonl").read_text().splitlines()]
    seconds = sorted(l["eval_s"] for l in lines if "eval_s" in l)
    return seconds[len(seconds) // 2], len(seconds)


def evaluation(f):
    link = ["memory.modelled_bandwidth_gbps=0.5"]
    resident, n = evaluations(SWEEP)
    swapped, _ = evaluations(SWEEP + SWAP + link)
    plan = bench(SWEEP + SWAP + link, steps=2)["swap"]
    f.write(f"## Evaluation\n\nCommand: `bench/swap.py {BUILD} evaluation`. Model: the sweep's, 8 validation "
            f"batches per evaluation, median of {n} evaluations in one run; swapped at a 0.5 GB/s modelled link "
            f"({len(plan['boundaries']) - 1} sub-models, boundaries {plan['boundaries']})."
            f"\n\n| run | ms per evaluation |\n|---|---|\n| resident | {1000 * resident:.1f} |\n"
            f"| swapped | {1000 * swapped:.1f} |\n\n")
    print("evaluation resident", resident, "swapped", swapped, flush=True)


def main():
    out = Path("bench/results/swap_cpu.md")
    parts = {"sweep": sweep, "largest": largest, "copies": copies, "offload": offload, "evaluation": evaluation}
    chosen = list(parts) if PART == "all" else [PART]
    text = {}
    for name in chosen:
        path = Path(f"/tmp/tessera-swap-{name}.md")
        with path.open("w") as f:
            parts[name](f)
        text[name] = path.read_text()
    old = out.read_text() if out.exists() else ""
    with out.open("w") as f:
        f.write("# ATOM swapping on the CPU device (memory.swap)\n\n")
        f.write("On the 2-core development machine (no GPU); each section names the command that measured it (a "
                "part run alone rewrites its own section). Times are medians of the timed steps after one warm-up; "
                "ratios are within one run of a part.\n\n")
        for name in parts:
            if name in text:
                f.write(text[name])
            elif f"## " in old:
                # keep an earlier part's section when only another part was run
                for section in old.split("\n## ")[1:]:
                    if section.lower().startswith({"sweep": "bandwidth", "largest": "the largest",
                                                   "copies": "bf16 copies", "offload": "against",
                                                   "evaluation": "evaluation"}[name]):
                        f.write("## " + section.rstrip("\n") + "\n\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
