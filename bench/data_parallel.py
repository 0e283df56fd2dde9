#!/usr/bin/env python3
"""Data-parallel overhead and ZeRO memory, measured with `tessera bench --nproc`.

Usage: data_parallel.py BUILD_DIR [--ranks 2] [--rounds 3] [--out bench/results]

Overhead: the same N processes (one thread each) run the same training step on a GPT of ~10M
parameters three ways, alternately, for --rounds rounds:
  no-comm    every rank trains alone (no data parallelism): the compute baseline;
  ddp        parallel.zero_stage = 0, fp32 gradients all-reduced in buckets during backward;
  ddp-bf16   the same with parallel.grad_compression = bf16;
  zero-1/2/3 the ZeRO stages.
Comparing with one process instead would measure this 2-core machine (two compute-bound processes
each run ~40% slower than one alone), not tessera. Reported per mode: the best median step time
over the rounds, its ratio to no-comm, the exposed communication (step - no-comm step), the dp
group's busy time per step (its communication thread running collectives) and the share of that
time hidden behind compute: overlap = 1 - exposed / busy (0 when nothing overlapped).
Results go to OUT/data_parallel_cpu.json and .md. With --baseline OTHER_BUILD (say, the previous
commit built elsewhere) every mode also runs with that build's binary, interleaved in the same rounds,
and the table gains its rows: a regression check that the machine's drift hits alike.
"""
import argparse
import json
import pathlib
import platform
import time

from tessera_bench import tessera_bench

MODEL = {"model.preset": "tiny_gpt", "model.vocab_size": 8192, "model.block_size": 128, "model.n_layer": 4,
         "model.n_head": 6, "model.n_embd": 384, "train.batch_size": 4, "train.seq_len": 128,
         "train.threads": 1, "optim.name": "adamw", "optim.grad_clip": 1.0, "data.path": "unused"}

MODES = {
    "no-comm": (["--no-comm"], {}),
    "ddp": ([], {"parallel.zero_stage": 0}),
    "ddp-bf16": ([], {"parallel.zero_stage": 0, "parallel.grad_compression": "bf16"}),
    "zero-1": ([], {"parallel.zero_stage": 1}),
    "zero-2": ([], {"parallel.zero_stage": 2}),
    "zero-3": ([], {"parallel.zero_stage": 3}),
}


def run(build, ranks, flags, sets, steps, warmup):
    return tessera_bench(build, "tiny_gpt", {**MODEL, **sets}, ranks, steps, warmup, flags)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--ranks", type=int, default=2)
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--steps", type=int, default=8)
    a.add_argument("--warmup", type=int, default=2)
    a.add_argument("--modes", default=",".join(MODES))
    a.add_argument("--out", default="bench/results")
    a.add_argument("--baseline", help="another build directory to run every mode with too, interleaved")
    args = a.parse_args()
    modes = args.modes.split(",")
    builds = [("", args.build)] + ([(" (baseline)", args.baseline)] if args.baseline else [])
    best = {}
    for r in range(args.rounds):
        for suffix, build in builds:
            for mode in modes:
                flags, sets = MODES[mode]
                result = run(build, args.ranks, flags, sets, args.steps, args.warmup)
                print(f"round {r + 1} {mode + suffix:20s} median step {result['median_step_s']:.4f} s", flush=True)
                key = mode + suffix
                if key not in best or result["median_step_s"] < best[key]["median_step_s"]:
                    best[key] = result
    rows = []
    for suffix, _ in builds:
        base = best["no-comm" + suffix]["median_step_s"]
        for mode in modes:
            b = best[mode + suffix]
            row = {"mode": mode + suffix, "step_s": b["median_step_s"], "ratio": b["median_step_s"] / base}
            if b.get("data_parallel"):
                exposed = max(0.0, b["median_step_s"] - base)
                busy = b["comm_busy_s_per_step"]
                row.update(exposed_s=exposed, busy_s=busy, bytes_per_step=b["comm_bytes_per_step"],
                           overlap=max(0.0, 1 - exposed / busy) if busy > 0 else 0.0)
            rows.append(row)
    params = best["no-comm"]["parameters"]
    lines = [f"# Data-parallel overhead on {args.ranks} ranks (CPU, Gloo over loopback, 1 thread per rank)", "",
             f"GPT of {params / 1e6:.1f}M parameters, batch 4 x 128 tokens per rank, AdamW. Best median of "
             f"{args.rounds} rounds x {args.steps} steps; every mode runs the same {args.ranks} processes.", "",
             "| mode | step s | vs no-comm | exposed comm s | comm busy s | overlap | MB sent/step/rank |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if "busy_s" in row:
            lines.append(f"| {row['mode']} | {row['step_s']:.4f} | {row['ratio']:.3f}x | {row['exposed_s']:.4f} | "
                         f"{row['busy_s']:.4f} | {100 * row['overlap']:.0f}% | {row['bytes_per_step'] / 1e6:.1f} |")
        else:
            lines.append(f"| {row['mode']} | {row['step_s']:.4f} | 1.000x | | | | |")
    baseline = f" --baseline {args.baseline}" if args.baseline else ""
    lines += ["", f"Command: `python3 bench/data_parallel.py {args.build} --ranks {args.ranks} --rounds {args.rounds} "
                  f"--modes {args.modes}{baseline}`",
              f"Machine: {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}"]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_parallel_cpu.json").write_text(json.dumps({"rows": rows, "raw": best}, indent=1))
    (out / "data_parallel_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
