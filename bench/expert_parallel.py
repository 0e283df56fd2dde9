#!/usr/bin/env python3
"""Expert parallelism: throughput and all-to-all volume, measured with `tessera bench --nproc`.

Usage: expert_parallel.py BUILD_DIR [--ranks 4] [--rounds 2] [--out bench/results]

The same N processes (one thread each) train a GPT whose every block is a mixture of 8 experts,
top-2, several ways, alternately, for --rounds rounds:
  no-comm        every rank trains alone, holding every expert: the compute baseline;
  dp, ep=1       data parallelism, every expert on every rank (expert gradients all-reduced);
  dp, ep=2 / 4   experts split over 2 / 4 ranks, tokens dispatched and combined by all-to-all;
  ep=4 dropless  model.moe_capacity_factor = 0 (buffers sized by the busiest expert);
  dense          dp, a dense MLP of the same active parameters (mlp_ratio x top_k).
Comparing with one process instead would measure this 2-core machine, not tessera. Reported per
mode: the best median step time over the rounds, tokens/s over all ranks, the ratio to no-comm, and
the ep group's all-to-all bytes per rank per MoE layer per step, against the formula for one
forward and backward: 4 x rows x C x 4 bytes x (N-1)/N (dispatch and combine, each in forward and
in backward), rows = E x capacity per micro-batch for capacity routing (tokens x k x factor);
dropless pads every rank's buffer to its busiest expert, so its ratio to tokens x k is the padding.
Results go to OUT/expert_parallel_cpu.json and .md.
"""
import argparse
import json
import math
import pathlib
import platform
import time

from tessera_bench import tessera_bench

MODEL = {"model.preset": "tiny_gpt", "model.vocab_size": 4096, "model.block_size": 128, "model.n_layer": 2,
         "model.n_head": 4, "model.n_embd": 128, "model.ffn": "moe", "model.moe_experts": 8, "model.moe_top_k": 2,
         "model.moe_every": 1, "model.moe_capacity_factor": 1.25, "train.batch_size": 4, "train.seq_len": 128,
         "train.threads": 1, "optim.name": "adamw", "data.path": "unused"}

MODES = {
    "no-comm": (["--no-comm"], {}),
    "dp, ep=1": ([], {}),
    "dp, ep=2": ([], {"parallel.ep": 2}),
    "dp, ep=4": ([], {"parallel.ep": 4}),
    "ep=4 dropless": ([], {"parallel.ep": 4, "model.moe_capacity_factor": 0}),
    "dense, same active": ([], {"model.ffn": "dense", "model.mlp_ratio": 8}),
}


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--ranks", type=int, default=4)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--steps", type=int, default=6)
    a.add_argument("--warmup", type=int, default=2)
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    best = {}
    for r in range(args.rounds):
        for mode, (flags, sets) in MODES.items():
            res = tessera_bench(args.build, "tiny_gpt", {**MODEL, **sets}, args.ranks, args.steps, args.warmup, flags)
            print(f"round {r + 1} {mode}: {res['median_step_s']:.4f} s", flush=True)
            if mode not in best or res["median_step_s"] < best[mode]["median_step_s"]:
                best[mode] = res
    N, E, k, C = args.ranks, MODEL["model.moe_experts"], MODEL["model.moe_top_k"], MODEL["model.n_embd"]
    layers = MODEL["model.n_layer"]
    tokens = MODEL["train.batch_size"] * MODEL["train.seq_len"]  # per rank per micro-batch
    base = best["no-comm"]["median_step_s"]
    rows = []
    for mode, res in best.items():
        row = {"mode": mode, "step_s": res["median_step_s"], "tokens_per_s": res["tokens_per_s"] * N,
               "vs_no_comm": res["median_step_s"] / base}
        sets = MODES[mode][1]
        ep = sets.get("parallel.ep", 1)
        if ep > 1:
            sent = res["ep_bytes_per_step"].get("all_to_all", 0.0) / layers
            factor = sets.get("model.moe_capacity_factor", MODEL["model.moe_capacity_factor"])
            buffer_rows = E * math.ceil(k * tokens / E * factor) if factor > 0 else tokens * k
            formula = 4 * buffer_rows * C * 4 * (ep - 1) / ep
            row.update(a2a_bytes_per_layer=sent, formula_bytes=formula, measured_over_formula=sent / formula)
        rows.append(row)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "ranks": N, "model": MODEL,
            "rounds": args.rounds, "steps": args.steps}
    (out / "expert_parallel_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows, "raw": best}, indent=1))
    lines = [f"# Expert parallelism on CPU ({N} processes, one thread each; {time.strftime('%Y-%m-%d')})", "",
             f"`python3 bench/expert_parallel.py build --ranks {N} --rounds {args.rounds}`: GPT, {layers} blocks, "
             f"every block {E} experts top-{k} (C = {C}), {MODEL['train.batch_size']} x {MODEL['train.seq_len']} "
             f"tokens per rank per step; best median step over the rounds.", "",
             "| mode | step s | tokens/s (all ranks) | vs no-comm | all-to-all bytes / rank / layer | formula | measured / formula |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        a2a = (f"{row['a2a_bytes_per_layer'] / 1e6:.3f} MB | {row['formula_bytes'] / 1e6:.3f} MB | "
               f"{row['measured_over_formula']:.3f}") if "formula_bytes" in row else "- | - | -"
        lines.append(f"| {row['mode']} | {row['step_s']:.4f} | {row['tokens_per_s']:.0f} | {row['vs_no_comm']:.3f} | {a2a} |")
    (out / "expert_parallel_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
