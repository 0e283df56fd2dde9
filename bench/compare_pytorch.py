#!/usr/bin/env python3
"""Training-step throughput of tessera against PyTorch (eager, and torch.compile) on the same
model, optimizer, batch and thread count, measured in one run on one machine.

Usage: compare_pytorch.py BUILD_DIR [--cases tiny_gpt,gpt2_124m] [--rounds N] [--out bench/results]
                          [--device cuda --dtype bf16 --batch B --steps N]

The peers run alternately (tessera, eager, compile, tessera, ...) for --rounds rounds so that drift
on a shared machine hits all of them alike; the table reports each peer's best median over the
rounds and tessera's ratio (tessera tokens/s divided by the peer's). Results go to
OUT/train_step_<device>_<cases>.json and .md. A peer's MFU is tessera's scaled by their tokens/s:
the same model and sequence, so the same FLOPs per token, over the peak tessera names (on a GPU the
card's published dense peak for the dtype, src/train/device_peak.h).

--activation-compression bf16|int8|int4|int4+int8 (+CORE: the attention core at CORE,
memory.attention_compression) runs both sides with their saved activations encoded
(tessera's memory.activation_compression; the twin's saved_tensors_hooks, eager only) and adds the
bytes each held for the backward at the step's peak.
--activation-offload N offloads the first N blocks' saved activations on both sides (tessera's
memory.activation_offload; the twin's torch.autograd.graph.save_on_cpu, eager only).

GPU (docs/gpu.md): `--device cuda --dtype bf16 --cases gpt2_124m_1024 --batch B` trains both sides
on the device with bf16 autocast; `--batch` and `--steps` override the case's.
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent

# Shapes passed explicitly to both sides, so they train the identical model.
CASES = {
    "tiny_gpt": dict(vocab=256, block=128, layers=4, heads=4, embd=128, batch=16, seq=128, steps=30, warmup=5),
    "gpt2_124m": dict(vocab=50257, block=1024, layers=12, heads=12, embd=768, batch=1, seq=512, steps=4, warmup=1),
    # The Llama blocks (tiny_llama: RMSNorm, rotary, grouped-query attention, SwiGLU, untied head).
    "tiny_llama": dict(family="llama", vocab=256, block=128, layers=4, heads=4, kv_heads=2, ffn=352, embd=128, batch=16,
                       seq=128, steps=30, warmup=5),
    # The GPU measurement of docs/gpu.md: sequence 1024, the batch from --batch.
    "gpt2_124m_1024": dict(vocab=50257, block=1024, layers=12, heads=12, embd=768, batch=8, seq=1024, steps=20, warmup=5),
    # About 1B parameters of Llama blocks at sequence 2048 (TinyLlama-1.1B's shapes: 22 blocks, width
    # 2048, 32 query and 4 kv heads, SwiGLU 5632, a 32000-token vocabulary): the GPU goal of docs/gpu.md.
    "llama_1b_2048": dict(family="llama", vocab=32000, block=2048, layers=22, heads=32, kv_heads=4, ffn=5632, embd=2048,
                          batch=4, seq=2048, steps=10, warmup=3),
}


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def tessera_cmd(build, c, threads, device, dtype, compression, offload=0):
    llama = c.get("family") == "llama"
    sets = {"model.preset": "tiny_llama" if llama else "tiny_gpt", "model.vocab_size": c["vocab"],
            "model.block_size": c["block"],
            "model.n_layer": c["layers"], "model.n_head": c["heads"], "model.n_embd": c["embd"],
            "train.batch_size": c["batch"], "train.seq_len": c["seq"], "train.threads": threads,
            "optim.name": "adamw", "optim.fused": "true", "optim.grad_clip": 1.0, "data.path": "unused",
            "train.device": device, "precision.dtype": dtype,
            "memory.activation_compression": compression.partition("+")[0],
            "memory.attention_compression": compression.partition("+")[2] or "same",
            "memory.activation_offload": offload}
    if llama:
        sets.update({"model.n_kv_head": c["kv_heads"], "model.ffn_hidden": c["ffn"]})
    cmd = [str(pathlib.Path(build) / "tessera"), "bench", "--config", "tiny_gpt", "--json",
           "--steps", str(c["steps"]), "--warmup", str(c["warmup"])]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def peer_cmd(c, mode, threads, device, dtype, compression, offload=0):
    cmd = [sys.executable, str(HERE / "pytorch_twin.py"), "--mode", mode, "--threads", str(threads),
           "--device", device, "--dtype", dtype, "--activation-compression", compression,
           "--activation-offload", str(offload)]
    for k in ("vocab", "block", "layers", "heads", "embd", "batch", "seq", "steps", "warmup"):
        cmd += [f"--{k}", str(c[k])]
    if c.get("family") == "llama":
        cmd += ["--family", "llama", "--kv_heads", str(c["kv_heads"]), "--ffn", str(c["ffn"])]
    return cmd


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--cases", default="tiny_gpt,gpt2_124m")
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--threads", type=int, default=os.cpu_count())
    a.add_argument("--peers", default="eager,compile")
    a.add_argument("--out", default=str(HERE / "results"))
    a.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a.add_argument("--batch", type=int, default=0, help="overrides the case's batch")
    a.add_argument("--steps", type=int, default=0, help="overrides the case's timed steps")
    a.add_argument("--activation-compression", default="none",
                   choices=["none", "bf16", "int8", "int4", "int4+int8", "none+int8"])
    a.add_argument("--activation-offload", type=int, default=0)
    args = a.parse_args()
    compression = args.activation_compression
    offload = args.activation_offload
    if offload and "compile" in args.peers.split(","):
        a.error("--activation-offload runs the eager twin only: pass --peers eager")
    if compression != "none" and "compile" in args.peers.split(","):
        a.error("--activation-compression runs the eager twin only: pass --peers eager")

    results = []
    for case in args.cases.split(","):
        c = dict(CASES[case])
        c.update({k: v for k, v in (("batch", args.batch), ("steps", args.steps)) if v})
        best = {}
        per_round = []  # each round's tokens/s by peer
        for r in range(args.rounds):
            per_round.append({})
            runs = [("tessera", tessera_cmd(args.build, c, args.threads, args.device, args.dtype, compression, offload))]
            runs += [(f"pytorch-{m}", peer_cmd(c, m, args.threads, args.device, args.dtype, compression, offload))
                     for m in args.peers.split(",")]
            for name, cmd in runs:
                t0 = time.time()
                try:
                    res = run_json(cmd)
                except subprocess.CalledProcessError as e:
                    print(f"[{case}] {name} failed:\n{e.stderr[-2000:]}", file=sys.stderr)
                    continue
                print(f"[{case}] round {r + 1} {name}: {res['tokens_per_s']:.0f} tok/s "
                      f"(median step {res['median_step_s']:.4f}s, wall {time.time() - t0:.0f}s)", flush=True)
                per_round[-1][name] = res["tokens_per_s"]
                if name not in best or res["tokens_per_s"] > best[name]["tokens_per_s"]:
                    best[name] = res
        base = best.get("tessera")
        for name, res in best.items():
            res["case"] = case
            res["batch"] = c["batch"]
            res["tessera_ratio"] = base["tokens_per_s"] / res["tokens_per_s"] if base else None
            # tessera over this peer within each round (the machine's drift between rounds cancels)
            res["paired_ratios"] = [rd["tessera"] / rd[name] for rd in per_round if "tessera" in rd and name in rd]
            if base and "mfu" not in res:
                res["mfu"] = base["mfu"] * res["tokens_per_s"] / base["tokens_per_s"]
            results.append(res)

    device = args.device.split(":")[0]
    named = next((r["device_name"] for r in results if r.get("device_name", "cpu") != "cpu"), platform.machine())
    peak = next((f"; MFU against {r['peak_flops'] / 1e12:.1f} TFLOP/s ({r['peak_basis']})"
                 for r in results if "peak_flops" in r), "")
    flags = "" if args.device == "cpu" else f" --device {args.device}"
    flags += f" --dtype {args.dtype}" if args.dtype != "fp32" else ""
    flags += f" --batch {args.batch}" if args.batch else ""
    flags += f" --steps {args.steps}" if args.steps else ""
    flags += f" --peers {args.peers}" if args.peers != "eager,compile" else ""
    flags += f" --activation-compression {compression}" if compression != "none" else ""
    flags += f" --activation-offload {offload}" if offload else ""
    saved = compression != "none"
    lines = [f"# Training-step throughput: tessera vs PyTorch ({device}, {args.dtype}"
             + (f", {compression} saved activations" if saved else "")
             + (f", {offload} blocks' activations offloaded" if offload else "") + ")", "",
             f"Machine: {named}, {os.cpu_count()} cores, {args.threads} threads{peak}; "
             f"`python3 bench/compare_pytorch.py build --cases {args.cases} --rounds {args.rounds}{flags}`; "
             f"best median over {args.rounds} alternating rounds; the paired ratio is tessera's tokens/s over the "
             "peer's within each round, their median and range.", "",
             "| case | peer | params | tokens/step | median step (s) | tokens/s | MFU | tessera ratio | paired ratio |"
             + (" saved MiB |" if saved else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if saved else "")]
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        held = f" {r['saved_activation_bytes'] / 2**20:.2f} |" if saved else ""
        ratios = r["paired_ratios"]
        paired = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
        lines.append(f"| {r['case']} | {r['peer']} | {r['parameters'] / 1e6:.2f}M | {r['tokens_per_step']:.0f} | "
                     f"{r['median_step_s']:.4f} | {r['tokens_per_s']:.0f} | {mfu} | {r['tessera_ratio']:.2f} | {paired} |" + held)
    text = "\n".join(lines) + "\n"
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"train_step_{device}_" + "_".join(args.cases.split(",")) + ("" if args.dtype == "fp32" else "_bf16")
    stem += f"_{compression}_activations" if saved else ""
    stem += f"_offload{offload}" if offload else ""
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
