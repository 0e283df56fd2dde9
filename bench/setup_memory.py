#!/usr/bin/env python3
"""Host memory of one rank at the end of set-up, before the first step, and during a checkpoint
save, for GPT-2 124M (fp32) at tp 1, 2, 4 and pp 1, 2, 4 (issue 25: each rank materialises only its
own part, and saves without holding the whole model).

Runs `tessera bench --json` on 1, 2 or 4 local processes (Gloo, CPU; one step of one micro-batch
per pipeline stage of 1 x 64 tokens, so set-up dominates) and reads "setup_by_rank": per rank, the
counting allocator's peak and held bytes over set-up (memory/host_memory_stats.h: every host
allocation, the model's parameters and AdamW's two moments, which it creates eagerly) and the
parameters the rank holds. The prediction for the held bytes is 12 bytes per held parameter
(float32 value + exp_avg + exp_avg_sq); the peak's excess over the held bytes is the transient
overhead of set-up (one parameter drawn whole before it is cut to the rank's part, and the
measurements of the layout). Reported for the rank that holds the most.

The save (`--save-to`, "save_by_rank"): after the step, each rank makes and writes its shares of a
distributed checkpoint as the trainer does (model_state_shard, training_state_slices); the peak of
the counting allocator above what the rank held before. Its bound: the rank's share of the whole
state written (the larger of its model share, 4 bytes per parameter / ranks, and its optimizer
share, 8 bytes per parameter / ranks: each is made and written in turn). Under tp nothing is
gathered: each rank writes its own part of a split tensor (checkpoint/region.h).

ZeRO-3 at dp 2 and 4: a rank holds 16 bytes per parameter / dp at the end of set-up (its shard, its
gradient shard, AdamW's moments of the shard); during set-up no more than one unit whole beyond
them (the largest is the ends', wte + wpe + ln_f) and the one parameter being drawn whole (wte).
With BASELINE_BUILD_DIR the same runs of that build are shown beside (the commit before ZeRO-3's
per-unit set-up materialised the whole stage, then flattened it). Written to
bench/results/setup_memory_cpu.md.

usage: bench/setup_memory.py [BUILD_DIR [BASELINE_BUILD_DIR]]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
BASELINE = Path(sys.argv[2]) if len(sys.argv) > 2 else None
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4)]  # (tp, pp)
MIB = 1 << 20
LARGEST = 50304 * 768 * 4  # bytes of GPT-2 124M's largest tensor, wte (vocabulary padded to 64)
ENDS_UNIT = ((50304 + 1024) * 768 + 2 * 768) * 4  # the ends' ZeRO unit: wte, wpe, ln_f (before padding)


def run(build, ranks, sets):
    cmd = [str(build / "tessera"), "bench", "--config", "gpt2_124m", "--steps", "1", "--warmup", "0", "--json",
           "--set", "train.batch_size=1", "--set", "train.seq_len=64", "--set", "train.threads=1", *sets]
    if ranks > 1:
        cmd += ["--nproc", str(ranks), "--out", "/tmp/tessera-setup-memory"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def zero3(build, dp):
    """Per rank (peak, held) of set-up at ZeRO-3 over dp ranks, and the whole model's parameters."""
    out = run(build, dp, ["--set", f"parallel.dp={dp}", "--set", "parallel.zero_stage=3"])
    by_rank = out["setup_by_rank"]
    return [tuple(by_rank[i:i + 2]) for i in range(0, len(by_rank), 3)], out["parameters"]


def bench(tp, pp):
    ranks = tp * pp
    cmd = [str(BUILD / "tessera"), "bench", "--config", "gpt2_124m", "--steps", "1", "--warmup", "0", "--json",
           "--set", "train.batch_size=1", "--set", "train.seq_len=64", "--set", f"train.grad_accum={max(pp, 1)}",
           "--set", "train.threads=1", "--set", f"parallel.tp={tp}", "--set", f"parallel.pp={pp}"]
    cmd += ["--save-to", f"/tmp/tessera-setup-memory-save-{tp}-{pp}"]
    if ranks > 1:
        cmd += ["--nproc", str(ranks), "--out", f"/tmp/tessera-setup-memory-{tp}-{pp}"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    out = json.loads(next(l for l in text.splitlines() if l.startswith("{")))
    by_rank, save = out["setup_by_rank"], out["save_by_rank"]
    return [tuple(by_rank[i:i + 3]) + (save[2 * (i // 3)],) for i in range(0, len(by_rank), 3)], out["parameters"]


def main():
    rows, saves = [], []
    for tp, pp in LAYOUTS:
        ranks, total = bench(tp, pp)
        peak, held, params, _ = max(ranks, key=lambda r: r[2])
        rows.append((tp, pp, params, held, 12 * params, peak))
        world = tp * pp
        share = max(4, 8) * total / world
        saves.append((tp, pp, max(r[3] for r in ranks), share))
        print(tp, pp, params, held, peak, saves[-1], flush=True)
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
    lines += ["", "## During a checkpoint save", "",
              "The most any rank allocated above what it held, while making and writing its shares of a distributed "
              "checkpoint (`tessera bench --save-to`); share: the larger of its model and optimizer shares of the whole "
              "state, 8 bytes per parameter of the whole model / ranks (AdamW's two moments). Under tp each rank "
              "writes its own part of a split tensor, gathering nothing.", "",
              "| tp | pp | ranks | save peak above held MiB | share MiB | save peak / share |",
              "| --- | --- | --- | --- | --- | --- |"]
    for tp, pp, above, share in saves:
        lines.append(f"| {tp} | {pp} | {tp * pp} | {above / MIB:.1f} | {share / MIB:.1f} | {above / share:.3f} |")
    lines += ["", "## ZeRO-3 set-up", "",
              "The rank with the highest peak. Predicted held: 16 bytes x parameters / dp (shard, gradient shard, "
              "AdamW's two moments of the shard); bound on the peak above it: one unit whole (the ends', "
              f"{ENDS_UNIT / MIB:.1f} MiB) and the parameter being drawn (wte, {LARGEST / MIB:.1f} MiB)."
              + (f" Baseline: {BASELINE}." if BASELINE else ""), "",
              "| dp | held MiB | predicted MiB | held / predicted | peak - held MiB | bound MiB |"
              + (" baseline peak MiB | baseline held MiB |" if BASELINE else ""),
              "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if BASELINE else "")]
    for dp in (2, 4):
        ranks, total = zero3(BUILD, dp)
        peak, held = max(ranks)
        predicted = 16 * total / dp
        row = (f"| {dp} | {held / MIB:.1f} | {predicted / MIB:.1f} | {held / predicted:.3f} | {(peak - held) / MIB:.1f} | "
               f"{(ENDS_UNIT + LARGEST) / MIB:.1f} |")
        if BASELINE:
            base_peak, base_held = max(zero3(BASELINE, dp)[0])
            row += f" {base_peak / MIB:.1f} | {base_held / MIB:.1f} |"
        lines.append(row)
        print(row, flush=True)
    text = "\n".join(lines) + "\n"
    Path("bench/results/setup_memory_cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
