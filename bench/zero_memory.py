#!/usr/bin/env python3
"""ZeRO memory per rank, measured against the ZeRO paper's formulas, with `tessera bench --nproc`.

Usage: zero_memory.py BUILD_DIR [--ranks 2,4] [--stages 0,1,2,3] [--out bench/results]

For each N in --ranks and each stage K, N processes (one thread each) train a GPT of GPT-2 124M's
shapes (12 blocks of width 768, vocabulary 50257, 1024 positions: the embeddings are 31% of it)
for a few AdamW steps in fp32. `tessera bench` counts CPU tensor bytes with its counting
allocator (src/memory/host_memory_stats.h) and rank 0 reports
  model_state_bytes  live bytes after a step (update and zero_grad done) minus those live before
                     the model was built: what model, optimizer and DataParallel hold;
  peak_bytes         the most live at once during the timed steps, on the same baseline.

Predicted bytes per rank (Rajbhandari et al., ZeRO, section 5; P parameters, fp32 + Adam: 4 bytes
of parameter, 4 of gradient, K = 8 of optimizer state, N = data-parallel degree):
  stage 0   (4 + 4 + 8) P
  stage 1   (4 + 4) P + 8 P / N
  stage 2   4 P + (4 + 8) P / N
  stage 3   (4 + 4 + 8) P / N
Stage 3 brings every unit (each block's, and the ends': embeddings and final norm) onto the device
only around its uses (memory/residency/), so between steps none is resident. Not in the formula,
and below 0.01% here: each ZeRO unit is padded to a multiple of N (at most N - 1 elements per unit)
and AdamW keeps one 4-byte step count per parameter slice. A row fails the 0.1% tolerance loudly.
Results go to OUT/zero_memory_cpu.json and .md.
"""
import argparse
import json
import pathlib
import platform
import time

from tessera_bench import tessera_bench

MODEL = {"model.preset": "tiny_gpt", "model.vocab_size": 50257, "model.block_size": 1024, "model.n_layer": 12,
         "model.n_head": 12, "model.n_embd": 768, "model.dropout": 0.0, "train.batch_size": 1, "train.seq_len": 64,
         "train.threads": 1, "optim.name": "adamw", "optim.grad_clip": 1.0, "precision.dtype": "fp32",
         "data.path": "unused"}
TOLERANCE = 0.001


def units(model):
    """Parameter counts of the ZeRO units: one per block, then the ends (GPT, bias on, dense MLP)."""
    c, h = model["model.n_embd"], 4 * model["model.n_embd"]
    block = 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * h + h) + (h * c + c)
    rest = model["model.vocab_size"] * c + model["model.block_size"] * c + 2 * c
    return [block] * model["model.n_layer"], rest


def predicted(stage, n, params):
    return {0: 16 * params, 1: 8 * params + 8 * params / n, 2: 4 * params + 12 * params / n,
            3: 16 * params / n}[stage]


def run(build, ranks, stage, steps, warmup):
    return tessera_bench(build, "tiny_gpt", {**MODEL, "parallel.zero_stage": stage}, ranks, steps, warmup)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--ranks", default="2,4")
    a.add_argument("--stages", default="0,1,2,3")
    a.add_argument("--steps", type=int, default=2)
    a.add_argument("--warmup", type=int, default=1)
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    blocks, rest = units(MODEL)
    params = sum(blocks) + rest
    rows, raw = [], []
    for n in [int(x) for x in args.ranks.split(",")]:
        for stage in [int(x) for x in args.stages.split(",")]:
            start = time.time()
            result = run(args.build, n, stage, args.steps, args.warmup)
            if result["parameters"] != params:
                raise SystemExit(f"model has {result['parameters']} parameters, units() counts {params}")
            want = predicted(stage, n, params)
            got = result["model_state_bytes"]
            row = {"ranks": n, "stage": stage, "measured_bytes": got, "predicted_bytes": want, "ratio": got / want,
                   "excess_bytes": got - want,
                   "bytes_per_param": got / params, "peak_bytes": result["peak_bytes"],
                   "step_s": result["median_step_s"], "within_tolerance": abs(got / want - 1) <= TOLERANCE}
            rows.append(row)
            raw.append(result)
            print(f"N={n} stage {stage}: measured {got / 2**20:8.1f} MiB, predicted {want / 2**20:8.1f} MiB, "
                  f"ratio {got / want:.4f}, peak {result['peak_bytes'] / 2**20:.1f} MiB "
                  f"({time.time() - start:.0f} s)", flush=True)
    lines = [f"# ZeRO memory per rank (CPU, fp32, AdamW)", "",
             f"GPT of {params / 1e6:.2f}M parameters ({MODEL['model.n_layer']} blocks of {blocks[0]:,}, ends "
             f"(embeddings, final norm) {rest:,} = {100 * rest / params:.2f}%), vocab {MODEL['model.vocab_size']}, "
             f"batch 1 x {MODEL['train.seq_len']} tokens per rank. Rank 0's CPU tensor bytes after step "
             f"{args.warmup + args.steps} (update and zero_grad done), minus those before the model was built, "
             f"against the ZeRO formula for P parameters: 16P, 8P + 8P/N, 4P + 12P/N, 16P/N.", "",
             "| N | stage | measured MiB | predicted MiB | measured / predicted | excess bytes | bytes / param | peak MiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['stage']} | {r['measured_bytes'] / 2**20:.1f} | "
                     f"{r['predicted_bytes'] / 2**20:.1f} | {r['ratio']:.4f} | {r['excess_bytes']:.0f} | {r['bytes_per_param']:.3f} | "
                     f"{r['peak_bytes'] / 2**20:.1f} |")
    lines += ["", f"Command: `python3 bench/zero_memory.py {args.build} --ranks {args.ranks} --stages {args.stages}`",
              f"Machine: {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}"]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "zero_memory_cpu.json").write_text(
        json.dumps({"model": MODEL, "parameters": params, "rest_parameters": rest, "rows": rows, "raw": raw},
                   indent=1))
    (out / "zero_memory_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [r for r in rows if not r["within_tolerance"]]
    if failed:
        raise SystemExit(f"{len(failed)} row(s) outside {TOLERANCE:.1%} of the formula: "
                         + ", ".join(f"N={r['ranks']} stage {r['stage']}" for r in failed))


if __name__ == "__main__":
    main()
