#!/usr/bin/env python3
"""Peak activation memory per pipeline rank, for every schedule, against the schedule's count.

Runs `tessera bench` on PP local processes (Gloo, CPU) with the counting allocator
(memory/host_memory_stats.h) for each built-in schedule on the same model, micro-batches and cut,
and reads every pipeline rank's peak host tensor bytes during a step and its model state between
steps (pp_peak_bytes, pp_model_state_bytes). What a rank holds beyond its state during the step is
its activations plus its gradients and transients:

    extra_r = peak_r - state_r

The schedules' counts (the simulator's peak_held, in activations of one micro-batch for one chunk)
say how many activations each rank keeps at once. GPipe keeps all m on every rank, so

    A_r = (extra_r(gpipe) - extra_r(1 micro-batch)) / (m - 1)

is one micro-batch's activations of rank r's stages (the 1-micro-batch run's extra is what does
not scale with held activations: gradients and one backward's transients), and a schedule is
predicted to need extra_r(1) + (held_r / v - 1) A_r, with v chunks per rank. Written to
bench/results/pipeline_memory_cpu.md.

usage: bench/pipeline_memory.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
PP, M, LAYERS = 4, 8, 8
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev"]
COMMON = ["--config", "tiny_gpt", "--nproc", str(PP), "--steps", "2", "--warmup", "1", "--json",
          "--set", f"parallel.pp={PP}", "--set", f"model.n_layer={LAYERS}", "--set", "model.n_embd=128",
          "--set", "model.n_head=4", "--set", "train.batch_size=8", "--set", "train.seq_len=128",
          "--set", "model.block_size=128", "--set", "train.threads=1", "--out", "/tmp/tessera-pipeline-memory"]


def bench(schedule, micro_batches):
    cmd = [str(BUILD / "tessera"), "bench", *COMMON, "--set", f"parallel.pp_schedule={schedule}",
           "--set", f"train.grad_accum={micro_batches}"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = next(l for l in text.splitlines() if l.startswith("{"))
    return json.loads(line)


def held(schedule):
    text = subprocess.run([str(BUILD / "tessera"), "pipeline", "--schedule", schedule, "--pp", str(PP),
                           "--microbatches", str(M)], check=True, capture_output=True, text=True).stdout
    line = next(l for l in text.splitlines() if l.startswith("peak activations held"))
    return [int(x) for x in line.split(":")[1].split()]


def extra(result):
    return [p - s for p, s in zip(result["pp_peak_bytes"], result["pp_model_state_bytes"])]


def main():
    base = extra(bench("gpipe", 1))
    gpipe = extra(bench("gpipe", M))
    unit = [(g - b) / (M - 1) for g, b in zip(gpipe, base)]
    mib = 1 / 1048576
    rows = []
    for schedule in SCHEDULES:
        measured = gpipe if schedule == "gpipe" else extra(bench(schedule, M))
        counts = held(schedule)
        v = 2 if schedule in ("interleaved", "zbv", "dualpipev") else 1
        predicted = [b + (c / v - 1) * a for b, c, a in zip(base, counts, unit)]
        rows.append((schedule, counts, measured, predicted))
        print(schedule, "held", counts, "measured MiB", [round(x * mib, 1) for x in measured],
              "predicted MiB", [round(x * mib, 1) for x in predicted], flush=True)
    out = Path("bench/results/pipeline_memory_cpu.md")
    with out.open("w") as f:
        f.write(f"# Peak activation memory per pipeline rank (CPU, counting allocator)\n\n")
        f.write(f"Command: `bench/pipeline_memory.py {BUILD}` (tiny_gpt widened to n_embd 128, {LAYERS} blocks, "
                f"pp {PP}, {M} micro-batches of 8 x 128 tokens, `tessera bench` with --nproc {PP}). Per rank: the "
                "bytes of CPU tensors live at the step's peak beyond the model state (activations, gradients, "
                "transients), measured, and predicted from the schedule's count of held activations (the "
                "simulator's peak, chunks of 1/v of a rank's blocks) with one micro-batch's activations A_r of "
                "rank r calibrated by GPipe (m held) against a 1-micro-batch run (see the script's docstring). "
                "Rank 0 holds the embedding, rank 3 the head and loss (and under V placement rank 0 both).\n\n")
        f.write(f"A_r (MiB): {', '.join(f'{a * mib:.2f}' for a in unit)}; 1-micro-batch extra (MiB): "
                f"{', '.join(f'{b * mib:.2f}' for b in base)}\n\n")
        f.write("| schedule | held per rank (chunks) | measured MiB per rank | predicted MiB per rank | worst "
                "measured / predicted |\n|---|---|---|---|---|\n")
        for schedule, counts, measured, predicted in rows:
            worst = max(m / p for m, p in zip(measured, predicted))
            f.write(f"| {schedule} | {' '.join(map(str, counts))} | "
                    f"{' '.join(f'{x * mib:.1f}' for x in measured)} | "
                    f"{' '.join(f'{x * mib:.1f}' for x in predicted)} | {worst:.2f} |\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
