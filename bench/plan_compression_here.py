#!/usr/bin/env python3
"""The planner's price of activation compression against runs on this machine (issues 50, 53).

For each config (default tiny_gpt and tiny_llama, float32, one process, batch BATCH) and each
codec, `tessera plan` predicts the step with every layout key held (one process, no checkpointing)
on CLUSTER (default this_machine_2core, whose device.activation_codec_*_gbs `tessera plan
calibrate` measured), and `tessera bench` times it, ROUNDS rounds of the codecs one after another.
Compared: the step over the uncompressed one, predicted and measured (the median over rounds of
each round's ratio). The runs set nothing in the prediction.
Written to bench/results/plan_compression_cpu.md.

usage: bench/plan_compression_here.py BUILD_DIR [--rounds 3] [--steps 10] [--configs tiny_gpt,tiny_llama]
                                      [--codecs none,bf16,int8,fp8] [--cluster this_machine_2core] [--batch 16]
A codec is CODEC[:BITS][+CORE] (tessera_bench.compression_settings: adaptive:6 holds
memory.activation_bits at 6, int4+int8 the attention core at int8).
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from tessera_bench import compression_settings, plan_step, tessera_bench  # noqa: E402

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default="tiny_gpt,tiny_llama")
    ap.add_argument("--codecs", default="none,bf16,int8,fp8")
    ap.add_argument("--cluster", default="this_machine_2core")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default="bench/results/plan_compression_cpu.md")
    args = ap.parse_args()
    codecs = args.codecs.split(",")
    if codecs[0] != "none":
        raise SystemExit("--codecs: the first must be none (the ratios' denominator)")
    lines = ["# The planner's price of activation compression against runs (CPU)", "",
             f"`python3 bench/plan_compression_here.py {args.build} --rounds {args.rounds} --steps {args.steps} "
             f"--configs {args.configs} --codecs {args.codecs} --cluster {args.cluster} --batch {args.batch}`: one "
             f"process, float32, batch {args.batch}; `tessera plan` with every layout key held against `tessera bench`, the codecs of a "
             "round one after another.", "",
             "| config | codec | predicted step / none | measured step / none | error of the step |",
             "|---|---|---|---|---|"]
    for config in args.configs.split(","):
        batch = args.batch
        predicted = {c: plan_step(args.build, config, args.cluster, {**compression_settings(c), "train.batch_size": batch})
                     for c in codecs}
        ratios = {c: [] for c in codecs}
        for r in range(args.rounds):
            steps = {c: tessera_bench(args.build, config, {**compression_settings(c), "train.batch_size": batch},
                                      steps=args.steps)["median_step_s"] for c in codecs}
            for c in codecs:
                ratios[c].append(steps[c] / steps["none"])
            print(f"{config} round {r + 1}: " + ", ".join(f"{c} {1e3 * steps[c]:.1f} ms" for c in codecs), flush=True)
        for c in codecs[1:]:
            p = predicted[c] / predicted["none"]
            m = statistics.median(ratios[c])
            lines.append(f"| {config} | {c} | {p:.3f} | {m:.3f} | {100 * (p / m - 1):+.1f}% |")
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
