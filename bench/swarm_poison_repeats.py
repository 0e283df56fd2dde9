#!/usr/bin/env python3
"""The aggregation rules without poison, each run several times: how far apart runs of one rule
end, against how far the rules end from each other (issue 55: with no poison the robust rules end
within 1% of `mean`).

    python3 bench/swarm_poison_repeats.py BUILD_DIR [--repeats 2] [--steps 150]
        [--rules mean,centered_clip,trimmed_mean] [--out bench/results/swarm_poison_repeats_cpu.md]

Four batch-mode peers of tiny_gpt on loopback, as bench/swarm_poison.py's "none" case: every peer
train.batch_size 16, target batch 64, adamw, one intra-op thread each. The runs alternate between
the rules (rule 1, rule 2, ..., then again). Reports each run's final validation loss (peer 0's)
and each rule's mean against `mean`'s.
"""
import argparse
import statistics
import tempfile

from results_file import write_results
from swarm_peers import last, prepared_corpus, run_swarm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rules", default="mean,centered_clip,trimmed_mean")
    ap.add_argument("--out", default="bench/results/swarm_poison_repeats_cpu.md")
    a = ap.parse_args()
    data = prepared_corpus(a.build)
    common = ["--set", "data.path=" + data, "--set", "train.steps=%d" % a.steps, "--set", "train.batch_size=16",
              "--set", "eval.every=1000000", "--set", "checkpoint.every=1000000", "--set", "train.threads=1",
              "--set", "optim.warmup_steps=10", "--set", "optim.name=adamw", "--set", "swarm.sync=batch",
              "--set", "swarm.target_batch_size=64"]
    work = tempfile.mkdtemp(prefix="swarm_poison_repeats_")
    rules = a.rules.split(",")
    losses = {rule: [] for rule in rules}
    for r in range(a.repeats):
        for rule in rules:
            dirs, seconds = run_swarm(a.build, work, "%s_%d" % (rule, r), 4,
                                      common + ["--set", "swarm.aggregation=" + rule])
            losses[rule].append(last(dirs[0], "val_loss"))
            print("run %d %-14s val loss %.4f (%.0f s)" % (r + 1, rule, losses[rule][-1], seconds), flush=True)
    base = statistics.mean(losses[rules[0]])
    lines = ["# Aggregation rules without poison, repeated (CPU, loopback)", "",
             "`python3 bench/swarm_poison_repeats.py BUILD --repeats %d --steps %d --rules %s`" % (
                 a.repeats, a.steps, a.rules), "",
             "Four batch-mode peers of tiny_gpt, %d swarm steps of 16 x 4 samples, adamw, no poison; the runs "
             "alternate between the rules." % a.steps, "",
             "| rule | %s | mean | spread of its runs | mean vs %s |" % (
                 " | ".join("run %d" % (r + 1) for r in range(a.repeats)), rules[0]),
             "|---|%s---|---|---|" % ("---|" * a.repeats)]
    for rule in rules:
        v = losses[rule]
        m = statistics.mean(v)
        lines.append("| %s | %s | %.4f | %.2f%% | %+.2f%% |" % (
            rule, " | ".join("%.4f" % x for x in v), m, 100 * (max(v) - min(v)) / m, 100 * (m / base - 1)))
    write_results(a.out, lines)


if __name__ == "__main__":
    main()
