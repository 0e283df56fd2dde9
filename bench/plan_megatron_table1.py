#!/usr/bin/env python3
"""tessera plan against the published runs of Narayanan et al. (SC'21), Table 1: ten GPT models
from 1.7B parameters on 32 A100s to 1T on 3072, on Selene (clusters/dgx_a100_80g.toml).

Each row is predicted for the layout as the paper ran it: its tensor- and pipeline-parallel
degrees, world, global batch, sequence 2048, vocabulary 51200, full recomputation, the interleaved
schedule where there is a pipeline, no Megatron-SP (it came later), attention as Megatron ran it
then (--attention unfused); bf16 stands for the paper's fp16 (same tensor-core rate on the A100;
tessera keeps fp16 for one process only). The search chooses the rest (micro-batch, stages per
rank, ZeRO stage). The throughput is counted as the paper counts it:
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, per GPU F / (step x GPUs).
No number of these rows went into the cluster file (its sources are named there).

usage: bench/plan_megatron_table1.py [--tessera build/tessera] [--out bench/results/plan_megatron_table1.md]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

# params (B), heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU
ROWS = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200


def paper_flops(batch, layers, hidden):
    return 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def predict(binary, row, work):
    params, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    config = os.path.join(work, f"gpt_{params}b.toml")
    with open(config, "w") as f:
        f.write(f"""[model]
vocab_size = {VOCAB}
n_layer = {layers}
n_head = {heads}
n_embd = {hidden}
block_size = {SEQ}
dropout = 0.1
[train]
batch_size = 1
seq_len = {SEQ}
global_batch_size = {batch}
device = "cuda"
[precision]
dtype = "bf16"
[parallel]
tp = {tp}
pp = {pp}
""")
    sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", "memory.activation_checkpointing=full",
            "parallel.megatron_sp=false"]
    if pp > 1:
        sets.append("parallel.pp_schedule=interleaved")
    args = [binary, "plan", "--config", config, "--cluster", "dgx_a100_80g", "--world", str(gpus),
            "--attention", "unfused", "--top", "1", "--json"]
    for s in sets:
        args += ["--set", s]
    start = time.time()
    out = subprocess.run(args, capture_output=True, text=True)
    seconds = time.time() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    best = json.loads(out.stdout)["layouts"][0]
    return best, seconds, " ".join(f"--set {s}" for s in sets)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default="build/tessera")
    parser.add_argument("--out", default="bench/results/plan_megatron_table1.md")
    a = parser.parse_args()
    lines = ["| params (B) | t | p | GPUs | batch | chosen (mb, v, ZeRO) | predicted step s | predicted TFLOP/s/GPU | "
             "published | error | fits (GiB) | search s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errors = []
    with tempfile.TemporaryDirectory() as work:
        for row in ROWS:
            params, heads, hidden, layers, tp, pp, gpus, batch, published = row
            best, seconds, _ = predict(a.tessera, row, work)
            tflops = paper_flops(batch, layers, hidden) / (best["step_s"] * gpus) / 1e12
            error = tflops / published - 1
            errors.append(error)
            s = best["set"]
            chosen = f"{s['train.batch_size']}, {s.get('parallel.pp_virtual', '-')}, {s['parallel.zero_stage']}"
            lines.append(f"| {params} | {tp} | {pp} | {gpus} | {batch} | {chosen} | {best['step_s']:.2f} | {tflops:.0f} | "
                         f"{published} | {100 * error:+.1f}% | {'yes' if best['fits'] else 'no'} "
                         f"({best['peak_memory_gib']:.0f}) | {seconds:.1f} |")
            print(lines[-1], flush=True)
    mean = sum(abs(e) for e in errors) / len(errors)
    worst = max(abs(e) for e in errors)
    summary = f"mean absolute error {100 * mean:.1f}%, worst {100 * worst:.1f}%"
    print(summary)
    with open(a.out, "w") as f:
        f.write("# tessera plan against Narayanan et al. (SC'21) Table 1\n\n"
                "`bench/plan_megatron_table1.py` (clusters/dgx_a100_80g.toml; the script's docstring says how each "
                "row is held). Predicted throughput counted as the paper counts it.\n\n")
        f.write("\n".join(lines) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
