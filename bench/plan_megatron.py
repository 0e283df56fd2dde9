#!/usr/bin/env python3
"""tessera plan against the published runs of Narayanan et al. (SC'21) on Selene
(clusters/dgx_a100_80g.toml): Table 1, ten GPT models from 1.7B parameters on 32 A100s to 1T on
3072, and Table 2, ZeRO-3 without model parallelism against PTD-P at 175B and 530B.

Each row is predicted for the layout as the paper ran it: its tensor- and pipeline-parallel
degrees (no sequence parallelism), world, global batch, sequence 2048, vocabulary 51200, full recomputation, the interleaved
schedule where there is a pipeline, no Megatron-SP (it came later), attention as Megatron ran it
then (--attention unfused), no ZeRO (Megatron-LM of 2021 replicated the optimizer state over the
data-parallel ranks) and the gradients all-reduced in one bucket after the backward
(parallel.bucket_mb = 65536: Megatron-LM's contiguous buffer of 2021); bf16 stands for the paper's fp16 (same tensor-core rate on the A100;
tessera keeps fp16 for one process only). The search chooses the rest (micro-batch, stages per
rank). Until 2026-12-04 the ZeRO stage was searched too, and it chose ZeRO-3 for the rows without a
pipeline, whose overlapped reduce-scatters beat the one bucket after the backward: a layout the
paper did not run. Table 2's ZeRO-3 rows hold tp = pp = 1 and ZeRO stage 3 (DeepSpeed's, which the
paper ran, with full recomputation as its PTD-P rows, and its default reduce bucket of 5e8 elements as
parallel.bucket_mb = 1000); its PTD-P rows hold the paper's model-parallel
size as tp 8 x pp 12 (175B, 96 layers) and tp 8 x pp 35 (530B, 105 layers).
The throughput is counted as the paper counts it:
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, per GPU F / (step x GPUs).
No number of these rows went into the cluster file (its sources are named there).

usage: bench/plan_megatron.py [--tessera build/tessera] [--out bench/results/plan_megatron.md]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

# params (B), heads, hidden, layers, tp, pp, ZeRO stage held, GPUs, batch,
# published TFLOP/s per GPU
ROWS = [
    (1.7, 24, 2304, 24, 1, 1, 0, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 0, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 0, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 0, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 0, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 0, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 0, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 0, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 0, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 0, 3072, 3072, 163),
]
# Table 2, the same columns
ROWS2 = [
    (174.6, 96, 12288, 96, 1, 1, 3, 384, 1536, 144),
    (174.6, 96, 12288, 96, 1, 1, 3, 768, 1536, 88),
    (174.6, 96, 12288, 96, 1, 1, 3, 1536, 1536, 44),
    (174.6, 96, 12288, 96, 8, 12, 0, 384, 1536, 153),
    (174.6, 96, 12288, 96, 8, 12, 0, 768, 1536, 149),
    (174.6, 96, 12288, 96, 8, 12, 0, 1536, 1536, 141),
    (529.6, 128, 20480, 105, 1, 1, 3, 640, 2560, 138),
    (529.6, 128, 20480, 105, 1, 1, 3, 1120, 2240, 98),
    (529.6, 128, 20480, 105, 1, 1, 3, 2240, 2240, 48),
    (529.6, 128, 20480, 105, 8, 35, 0, 560, 2240, 171),
    (529.6, 128, 20480, 105, 8, 35, 0, 1120, 2240, 167),
    (529.6, 128, 20480, 105, 8, 35, 0, 2240, 2240, 159),
]
SEQ, VOCAB = 2048, 51200


def paper_flops(batch, layers, hidden):
    return 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def predict(binary, params, heads, hidden, layers, tp, pp, gpus, batch, work, zero):
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
    sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", "parallel.sp=1", "memory.activation_checkpointing=full",
            "parallel.megatron_sp=false"]
    sets.append(f"parallel.zero_stage={zero}")
    if zero == 0:
        # Megatron-LM of 2021 all-reduced its contiguous gradient buffer in one call after the
        # backward: one bucket, nothing overlapped.
        sets.append("parallel.bucket_mb=65536")
    else:
        # DeepSpeed's ZeRO-3 as the paper ran it: gradients reduced in buckets of its default
        # reduce_bucket_size, 5e8 elements (1000 MB in fp16).
        sets.append("parallel.bucket_mb=1000")
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
    return json.loads(out.stdout)["layouts"][0], seconds


def table(binary, rows, work, layout_column):
    """The rows predicted: the markdown lines (a layout column naming ZeRO-3 or PTD-P where asked)
    and each row's relative error."""
    header = ("| params (B) |{} t | p | GPUs | batch | chosen (mb, v, ZeRO) | predicted step s | predicted TFLOP/s/GPU | "
              "published | error | fits (GiB) | search s |").format(" layout |" if layout_column else "")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    errors = []
    for params, heads, hidden, layers, tp, pp, zero, gpus, batch, published in rows:
        best, seconds = predict(binary, params, heads, hidden, layers, tp, pp, gpus, batch, work, zero)
        tflops = paper_flops(batch, layers, hidden) / (best["step_s"] * gpus) / 1e12
        error = tflops / published - 1
        errors.append(error)
        s = best["set"]
        chosen = f"{s['train.batch_size']}, {s.get('parallel.pp_virtual', '-')}, {s['parallel.zero_stage']}"
        layout = (" ZeRO-3 |" if zero == 3 else " PTD-P |") if layout_column else ""
        lines.append(f"| {params} |{layout} {tp} | {pp} | {gpus} | {batch} | {chosen} | {best['step_s']:.2f} | "
                     f"{tflops:.0f} | {published} | {100 * error:+.1f}% | {'yes' if best['fits'] else 'no'} "
                     f"({best['peak_memory_gib']:.0f}) | {seconds:.1f} |")
        print(lines[-1], flush=True)
    return lines, errors


def summary(errors):
    mean = sum(abs(e) for e in errors) / len(errors)
    worst = max(abs(e) for e in errors)
    return f"mean absolute error {100 * mean:.1f}%, worst {100 * worst:.1f}%"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default="build/tessera")
    parser.add_argument("--out", default="bench/results/plan_megatron.md")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        one, errors1 = table(a.tessera, ROWS, work, layout_column=False)
        two, errors2 = table(a.tessera, ROWS2, work, layout_column=True)
    with open(a.out, "w") as f:
        f.write("# tessera plan against Narayanan et al. (SC'21), Tables 1 and 2\n\n"
                "`bench/plan_megatron.py` (clusters/dgx_a100_80g.toml; the script's docstring says how each "
                "row is held). Predicted throughput counted as the paper counts it.\n\n## Table 1\n\n")
        f.write("\n".join(one) + "\n\n" + summary(errors1) + "\n\n## Table 2: ZeRO-3 against PTD-P\n\n")
        f.write("\n".join(two) + "\n\n" + summary(errors2) + "\n")
    print(summary(errors1))
    print(summary(errors2))


if __name__ == "__main__":
    main()
