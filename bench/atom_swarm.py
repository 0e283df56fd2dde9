#!/usr/bin/env python3
"""ATOM swarm: batch mode against DiLoCo at equal samples processed, and the bytes each sends.

    python3 bench/atom_swarm.py BUILD_DIR [--peers 3] [--steps 150] [--inner 10] [--dtypes fp32,bf16,int8]
        [--outer LR:MOMENTUM,...] [--topk 1,0.02,...] [--decay 1,0.95,...] [--ranks 0,4,...]

Runs a swarm of `--peers` peers of tiny_gpt on loopback (one machine, so the peers share its
cores: the time is not the point, the loss and the traffic are) for each mode:
  batch         swarm.sync = batch, target batch = peers x train.batch_size: one synchronous step
                per local step of every peer (data parallelism's computation), train.steps swarm steps;
  diloco fp32 / bf16 / int8 [top R%] [rank R]
                swarm.sync = diloco, swarm.inner_steps local steps between averages, train.steps
                local steps per peer; with --topk below 1 only that fraction of each chunk's
                entries travels (swarm.topk_ratio, with error feedback); with --ranks above 0
                (run besides the --topk values) each matrix travels as a rank-R product
                (swarm.pseudo_gradient_rank: PowerSGD, one side per round, with error feedback),
so every mode processes peers x steps x batch_size samples. Prints each mode's final validation
loss (mean over the peers; they hold the same parameters after an average, and each evaluates the
same batches), its ratio to batch mode's, the bytes each peer sent per sample it processed (from
metrics.jsonl's swarm fields), and data parallelism's bytes per sample by its formula: a ring
all-reduce of the float32 gradients every step, 2 (n-1)/n x 4 P bytes per rank per
train.batch_size samples.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from swarm_peers import last, prepared_corpus, run_swarm


def run_modes_swarm(build, work, name, peers, settings):
    dirs, seconds = run_swarm(build, work, name, peers, settings)
    losses, sent, samples = [], 0, 0
    for out in dirs:
        losses.append(last(out, "val_loss"))
        swarm = last(out, "swarm")
        sent += swarm["bytes_sent"]
        samples += swarm["samples_processed"]
    return sum(losses) / len(losses), sent / samples, seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--dtypes", default="fp32,bf16,int8", help="DiLoCo's pseudo-gradient dtypes to run")
    ap.add_argument("--outer", default="0.7:0.9",
                    help="DiLoCo's outer steps to run, LR:MOMENTUM each (swarm.outer_lr, swarm.outer_momentum)")
    ap.add_argument("--topk", default="1", help="DiLoCo's swarm.topk_ratio values to run (1: dense)")
    ap.add_argument("--decay", default="1", help="swarm.error_feedback_decay values to run with top-k or a rank")
    ap.add_argument("--ranks", default="0", help="DiLoCo's swarm.pseudo_gradient_rank values to run (0: whole)")
    ap.add_argument("--batch-loss", type=float,
                    help="batch mode's validation loss from an earlier run of the same --steps (batch mode is not run)")
    a = ap.parse_args()
    data = prepared_corpus(a.build)
    batch = 16
    common = ["--set", "data.path=" + data, "--set", "train.steps=%d" % a.steps, "--set", "train.batch_size=%d" % batch,
              "--set", "eval.every=1000000", "--set", "checkpoint.every=1000000", "--set", "train.threads=1",
              "--set", "optim.warmup_steps=10"]
    modes = [] if a.batch_loss else [("batch", ["--set", "swarm.sync=batch",
                                                "--set", "swarm.target_batch_size=%d" % (a.peers * batch)])]
    for dtype in a.dtypes.split(","):
        for outer in a.outer.split(","):
            variants = [(t, "0") for t in a.topk.split(",")] + [("1", r) for r in a.ranks.split(",") if r != "0"]
            for topk, rank in variants:
                for decay in (a.decay.split(",") if float(topk) < 1 or rank != "0" else ["1"]):
                    lr, momentum = outer.split(":")
                    name = ("diloco " + dtype + ("" if float(topk) == 1 else " top %g%%" % (100 * float(topk))) +
                            ("" if rank == "0" else " rank " + rank) +
                            ("" if float(decay) == 1 else " decay " + decay) +
                            ("" if outer == "0.7:0.9" else " outer " + outer))
                    modes.append((name, ["--set", "swarm.sync=diloco", "--set", "swarm.inner_steps=%d" % a.inner,
                                         "--set", "swarm.pseudo_gradient_dtype=" + dtype, "--set", "swarm.outer_lr=" + lr,
                                         "--set", "swarm.outer_momentum=" + momentum, "--set", "swarm.topk_ratio=" + topk,
                                         "--set", "swarm.pseudo_gradient_rank=" + rank,
                                         "--set", "swarm.error_feedback_decay=" + decay]))
    params = None  # "parameters: N (...)" in `tessera inspect`
    out = subprocess.run([os.path.join(a.build, "tessera"), "inspect", "--config", "tiny_gpt"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("parameters: "):
            params = int(line.split()[1])
    if params is None:
        sys.exit("tessera inspect printed no parameter count")
    work = tempfile.mkdtemp(prefix="atom_swarm_")
    rows = [("batch (an earlier run's loss)", a.batch_loss, None, 0)] if a.batch_loss else []
    for name, settings in modes:
        tag = name.replace(" ", "_").replace(":", "_").replace("%", "pct")
        loss, per_sample, seconds = run_modes_swarm(a.build, work, tag, a.peers, common + settings)
        rows.append((name, loss, per_sample, seconds))
        print("%-12s val loss %.4f, %.0f bytes sent per sample, %.0f s" % (name, loss, per_sample, seconds),
              flush=True)
    n = a.peers
    dp = 2 * (n - 1) / n * 4 * params / batch
    base = rows[0][1]
    print()
    print("%d peers of tiny_gpt (%d parameters), %d x %d x %d = %d samples each mode, DiLoCo every %d local steps"
          % (n, params, n, a.steps, batch, n * a.steps * batch, a.inner))
    print()
    print("| mode | val loss | vs batch | bytes sent / sample | data parallelism / this |")
    print("|---|---|---|---|---|")
    print("| data parallelism (formula) | - | - | %.0f | 1.0 |" % dp)
    for name, loss, per_sample, _ in rows:
        if per_sample is None:
            print("| %s | %.4f | +0.00%% | - | - |" % (name, loss))
        else:
            print("| %s | %.4f | %+.2f%% | %.0f | %.1f |" % (name, loss, 100 * (loss / base - 1), per_sample,
                                                          dp / per_sample))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
