#!/usr/bin/env python3
"""Host memory of one rank at the end of set-up, before the first step, for GPT-2 124M (fp32) at
tp 1, 2, 4 and pp 1, 2, 4 (issue 25: each rank materialises only its own part).

Runs `tessera bench --json` on 1, 2 or 4 local processes (Gloo, CPU; one step of one micro-batch
per pipeline stage of 1 x 64 tokens, so set-up dominates) and reads "setup_by_rank": per rank, the
counting allocator's peak and held bytes over set-up (memory/host_memory_stats.h: every host
allocation, the model's parameters and AdamW's two moments, which it creates eagerly) and the
parameters the rank holds. The prediction for the held bytes is 12 bytes per held parameter
(float32 value + exp_avg + exp_avg_sq); the peak's excess over the held bytes is the transient
overhead of set-up (one parameter drawn whole before it is cut to the rank's part, and the
measurements of the layout). Reported for the rank that holds the most. Written to
bench/results/setup_memory_cpu.md.

usage: bench/setup_memory.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4)]  # (tp, pp)
MIB = 1 << 20


def bench(tp, pp):
    ranks = tp * pp
    cmd = [str(BUILD / "tessera"), "bench", "--config", "gpt2_124m", "--steps", "1", "--warmup", "0", "--json",
           "--set", "train.batch_size=1", "--set", "train.seq_len=64", "--set", f"train.grad_accum={max(pp, 1)}",
           "--set", "train.threads=1", "--set", f"parallel.tp={tp}", "--set", f"parallel.pp={pp}"]
    if ranks > 1:
        cmd += ["--nproc", str(ranks), "--out", f"/tmp/tessera-setup-memory-{tp}-{pp}"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    out = json.loads(next(l for l in text.splitlines() if l.startswith("{")))
    by_rank = out["setup_by_rank"]
    return [tuple(by_rank[i:i + 3]) for i in range(0, len(by_rank), 3)]


def main():
    rows = []
    for tp, pp in LAYOUTS:
        ranks = bench(tp, pp)
        peak, held, params = max(ranks, key=lambda r: r[2])
        rows.append((tp, pp, params, held, 12 * params, peak))
        print(tp, pp, params, held, peak, flush=True)
    whole = rows[0][2]
    lines = ["# Set-up host memory per rank, GPT-2 124M fp32 (CPU)", "",
             "`bench/setup_memory.py` (`tessera bench --json`'s setup_by_rank; the rank holding the most "
             "parameters). Held: bytes allocated at the end of set-up; predicted: 12 bytes per held parameter "
             "(value + AdamW's exp_avg and exp_avg_sq, created eagerly); peak: the most held during set-up.", "",
             "| tp | pp | parameters on the rank | of the whole | held MiB | predicted MiB | held / predicted | peak MiB | peak - held MiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tp, pp, params, held, predicted, peak in rows:
        lines.append(f"| {tp} | {pp} | {params / 1e6:.2f}M | {params / whole:.3f} | {held / MIB:.1f} | {predicted / MIB:.1f} | "
                     f"{held / predicted:.3f} | {peak / MIB:.1f} | {(peak - held) / MIB:.1f} |")
    text = "\n".join(lines) + "\n"
    Path("bench/results/setup_memory_cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
