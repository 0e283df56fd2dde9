#!/usr/bin/env python3
"""The largest micro-batch and the longest sequence whose saved activations fit a device budget,
for each activation memory saver alone and combined (issue 53).

One process, float32, CONFIG (default tiny_gpt) with model.block_size raised to --max-seq so that
sequences may grow. For each policy:
  1. one `tessera bench --json` run at --probe-batch sequences of --probe-seq tokens gives the
     device's saved activation peak (saved_activation_bytes: memory/saved_activations.h);
  2. per token that peak is the policy's cost (every saver here holds bytes linear in the tokens:
     the CPU's attention keeps no T x T scores), so the budget gives the largest batch at
     --probe-seq tokens (capped at --max-batch) and the longest single sequence (capped at
     --max-seq);
  3. both are run, and their measured peak and step time reported: the prediction is checked on
     runs that did not set it.
The budget counts the blocks' saved activations only (the model's state and the head's are the
same under every policy). Written to bench/results/activation_budget_cpu.md.

usage: bench/activation_budget.py BUILD_DIR [--budget-mib 32] [--config tiny_gpt] [--probe-batch 4]
                                  [--probe-seq 128] [--max-seq 8192] [--max-batch 256] [--steps 2]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from tessera_bench import tessera_bench  # noqa: E402

MIB = 1024 * 1024


def policies(layers):
    return [
        ("resident", {}),
        ("int8", {"memory.activation_compression": "int8"}),
        ("selective recomputation", {"memory.activation_checkpointing": "selective"}),
        ("full recomputation", {"memory.activation_checkpointing": "full"}),
        (f"offload {layers - 1} of {layers}", {"memory.activation_offload": layers - 1}),
        (f"offload {layers} of {layers}", {"memory.activation_offload": layers}),
        (f"offload {layers} + int8", {"memory.activation_offload": layers, "memory.activation_compression": "int8"}),
        ("full + int8", {"memory.activation_checkpointing": "full", "memory.activation_compression": "int8"}),
        (f"full + offload {layers}", {"memory.activation_checkpointing": "full", "memory.activation_offload": layers}),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--budget-mib", type=float, default=32)
    ap.add_argument("--config", default="tiny_gpt")
    ap.add_argument("--layers", type=int, default=4, help="the config's model.n_layer")
    ap.add_argument("--probe-batch", type=int, default=4)
    ap.add_argument("--probe-seq", type=int, default=128)
    ap.add_argument("--max-seq", type=int, default=8192)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default="bench/results/activation_budget_cpu.md")
    args = ap.parse_args()
    budget = args.budget_mib * MIB
    base = {"model.block_size": args.max_seq}

    def run(sets, batch, seq):
        r = tessera_bench(args.build, args.config, {**base, **sets, "train.batch_size": batch, "train.seq_len": seq},
                          steps=args.steps, warmup=1)
        return r["saved_activation_bytes"], r["median_step_s"], batch * seq / r["median_step_s"]

    lines = [f"# Saved activations under a {args.budget_mib:g} MiB device budget ({args.config}, CPU)", "",
             f"`python3 bench/activation_budget.py {args.build} --budget-mib {args.budget_mib:g} --config {args.config} "
             f"--probe-batch {args.probe_batch} --probe-seq {args.probe_seq} --max-seq {args.max_seq} "
             f"--max-batch {args.max_batch}`: one process, "
             "float32, model.block_size raised to the longest sequence tried. Per policy: the device's saved "
             f"activation peak per token at {args.probe_batch} x {args.probe_seq} tokens, the largest micro-batch "
             f"of {args.probe_seq}-token sequences and the longest single sequence it predicts under the budget, "
             "and those two runs' measured peak (MiB) and speed (tokens/s). Offload: the CPU device's modelled "
             "link at 16 GB/s (memory.modelled_bandwidth_gbps' default).", "",
             "| policy | KiB/token | largest batch | its peak | its tokens/s | longest sequence | its peak | its tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, sets in policies(args.layers):
        probe, _, _ = run(sets, args.probe_batch, args.probe_seq)
        per_token = probe / (args.probe_batch * args.probe_seq)
        batch = min(args.max_batch, int(budget // (per_token * args.probe_seq)))
        seq = min(args.max_seq, int(budget // per_token))
        cells = [name, f"{per_token / 1024:.2f}"]
        for b, s, n in ((batch, args.probe_seq, batch), (1, seq, seq)):
            if n < 1:
                cells += ["0", "-", "-"]
                continue
            peak, _, tps = run(sets, b, s)
            mark = "" if peak <= budget else " (over)"
            cells += [str(n), f"{peak / MIB:.1f}{mark}", f"{tps:.0f}"]
        print(" | ".join(cells), flush=True)
        lines.append("| " + " | ".join(cells) + " |")
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
