#!/usr/bin/env python3
"""The longest sequence a 1B model trains at on 128 A100-80G (clusters/dgx_a100_80g.toml), as
tessera plan predicts it, by sequence-parallel method: LASP and LASP-2 on a linear-attention model
(tessera's lightning attention), Ulysses and ring attention on its softmax-attention twin (same
width and depth, rotary positions). The seed (LASP, arXiv 2404.02882) reports 4096K tokens on 128
A100-80G with TNL-1B, 8x longer than the other methods (on 64 GPUs: LASP 2048K, DeepSpeed-Ulysses
512K, Megatron-SP 256K).

Each method holds its sequence-parallel degree (LASP, LASP-2 and ring: 128, every rank a part of
one sequence; Ulysses: 16, the heads, with 8 data-parallel replicas that do not lengthen it), tp =
pp = 1 and one sequence per sequence-parallel group; the search chooses the ZeRO stage, and the
activation checkpointing twice: held at none (as the seed's runs appear to have trained: 66 GB at
4096K), then searched. Sequences double from 64K until no layout fits in 80 GB, or to 32768K (the
config's limit).

usage: bench/plan_lasp_longest.py [--tessera build/tessera] [--out bench/results/plan_lasp_longest.md]
"""
import argparse
import json
import os
import subprocess
import tempfile

WORLD = 128
MODEL = """[model]
arch = "{arch}"
vocab_size = 64000
n_layer = 16
n_head = 16
n_embd = 2048
block_size = 33554432
bias = false
{extra}
[train]
batch_size = 1
seq_len = 65536
device = "cuda"
[precision]
dtype = "bf16"
"""
METHODS = [("lasp", "linear", 128), ("lasp2", "linear", 128), ("ulysses", "gpt", 16), ("ring", "gpt", 16 * 8)]


def plan(binary, config, method, sp, seq, checkpointing):
    args = [binary, "plan", "--config", config, "--cluster", "dgx_a100_80g", "--world", str(WORLD), "--top", "1",
            "--json", "--set", f"parallel.sp={sp}", "--set", f"parallel.sp_method={method}", "--set", "parallel.tp=1",
            "--set", "parallel.pp=1", "--set", f"train.seq_len={seq}", "--set", "train.batch_size=1",
            "--set", f"train.global_batch_size={WORLD // sp}"]
    if checkpointing:
        args += ["--set", f"memory.activation_checkpointing={checkpointing}"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout)["layouts"][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--out", default="bench/results/plan_lasp_longest.md")
    a = ap.parse_args()
    tables = {}
    with tempfile.TemporaryDirectory() as work:
        for checkpointing in ("none", None):
            lines = ["| method | model | sp | longest that fits | memory GiB | predicted tokens/s there | chosen (ZeRO, "
                     "checkpointing) | next (does not fit) |", "|---|---|---|---|---|---|---|---|"]
            for method, arch, sp in METHODS:
                config = os.path.join(work, f"{arch}.toml")
                with open(config, "w") as f:
                    f.write(MODEL.format(arch=arch, extra='position = "rope"' if arch == "gpt" else ""))
                best, seq, over = None, 65536, None
                while seq <= 1 << 25:
                    p = plan(a.tessera, config, method, sp, seq, checkpointing)
                    if not p["fits"]:
                        over = (seq, p["peak_memory_gib"])
                        break
                    best = (seq, p)
                    seq *= 2
                nxt = f"{over[0] // 1024}K ({over[1]:.0f} GiB)" if over else "(the config's limit)"
                name = "linear" if arch == "linear" else "softmax"
                if best is None:
                    lines.append(f"| {method} | {name} | {sp} | none from 64K | | | | {nxt} |")
                else:
                    seq, p = best
                    s = p["set"]
                    lines.append(f"| {method} | {name} | {sp} | {seq // 1024}K | {p['peak_memory_gib']:.1f} | "
                                 f"{p['tokens_per_s']:,.0f} | {s['parallel.zero_stage']}, "
                                 f"{s['memory.activation_checkpointing']} | {nxt} |")
                print(lines[-1], flush=True)
            tables[checkpointing] = lines
    with open(a.out, "w") as f:
        f.write("# The longest sequence of a 1B model on 128 A100-80G, by sequence-parallel method (tessera plan)\n\n"
                "`python3 bench/plan_lasp_longest.py` (its docstring says what is held). Predicted, not run.\n\n")
        f.write("## Without activation checkpointing\n\n" + "\n".join(tables["none"]) + "\n\n")
        f.write("## Checkpointing chosen by the search\n\n" + "\n".join(tables[None]) + "\n")


if __name__ == "__main__":
    main()
