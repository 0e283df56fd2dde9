#!/usr/bin/env python3
"""parallel.pp_cut = layers, params and profile on a model whose head outweighs its blocks.

A GPT with a large vocabulary (8192) and narrow blocks (n_embd 64, 8 blocks) on pp = 2 with
1F1B, 8 micro-batches of 4 x 128 tokens: the last stage's head and loss cost several blocks, which
the even block cut ignores, the parameter cut counts by weight (the tied embedding on both ends)
and the profile cut measures. `tessera bench --nproc 2` (one thread each, so the two processes
do not share a core) reports each cut's tokens/s and, for profile, the predicted stage times.
Written to bench/results/pipeline_profile_cut_cpu.md.

usage: bench/pipeline_profile_cut.py [BUILD_DIR]
"""
import json
import subprocess
import sys
from pathlib import Path

BUILD = Path(sys.argv[1] if len(sys.argv) > 1 else "build")
SETS = ["parallel.pp=2", "model.n_layer=8", "model.n_embd=64", "model.n_head=4", "model.vocab_size=8192",
        "train.batch_size=4", "train.grad_accum=8", "train.threads=1"]


def bench(cut):
    args = [str(BUILD / "tessera"), "bench", "--config", "tiny_gpt", "--nproc", "2", "--steps", "5", "--warmup", "1",
            "--json", "--out", "/tmp/tessera-pipeline-profile-cut"]
    for s in SETS + [f"parallel.pp_cut={cut}"]:
        args += ["--set", s]
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in text.splitlines() if l.startswith("{")))


def main():
    rows = []
    for cut in ("layers", "params", "profile"):
        r = bench(cut)
        rows.append((cut, r))
        print(cut, r["tokens_per_s"], r["pp_cut"], flush=True)
    base = rows[0][1]["tokens_per_s"]
    out = Path("bench/results/pipeline_profile_cut_cpu.md")
    with out.open("w") as f:
        f.write("# Pipeline cuts on a model with a heavy head (CPU, pp 2, 2 processes)\n\n")
        f.write(f"Command: `bench/pipeline_profile_cut.py {BUILD}` (tiny_gpt with {', '.join(SETS)}; 1F1B; median "
                "of 5 steps after 1 warm-up). Blocks per stage from the cut's boundaries; predicted: the profile "
                "cut's measured forward + backward of one micro-batch per stage, averaged over both ranks.\n\n")
        f.write("| pp_cut | blocks per stage | predicted ms per stage | tokens/s | vs layers |\n|---|---|---|---|---|\n")
        for cut, r in rows:
            b = r["pp_cut"]["boundaries"]
            blocks = " / ".join(str(b[i + 1] - b[i]) for i in range(len(b) - 1))
            predicted = " / ".join(f"{1000 * t:.1f}" for t in r["pp_cut"]["predicted_s"]) or "-"
            f.write(f"| {cut} | {blocks} | {predicted} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f} |\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
