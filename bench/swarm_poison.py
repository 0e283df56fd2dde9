#!/usr/bin/env python3
"""ATOM swarm under poison: four peers (batch mode, or DiLoCo with --sync diloco), one of them
sending poisoned contributions, under each aggregation rule, against the three honest peers alone.

    python3 bench/swarm_poison.py BUILD_DIR [--steps 150] [--rules mean,centered_clip,trimmed_mean]
        [--poisons none,scale,flip,noise,stale,ascent] [--optim adamw] [--sync batch|diloco]
        [--out bench/results/swarm_poison_cpu]
    python3 bench/swarm_poison.py BUILD_DIR --render --out ...   (OUT.md and OUT.svg from OUT.json)
    python3 bench/swarm_poison.py BUILD_DIR --add --poisons ascent ...   (runs these, keeps OUT.json's others)

With --sync diloco every peer runs `--steps` local steps, averaging int8 pseudo-gradients every 10
(swarm.inner_steps), and the honest run is peers 0-2 alone the same way. In batch mode (below)
each case runs `--steps` swarm steps of tiny_gpt on loopback, every peer train.batch_size 16 and
the target batch 16 x peers (one synchronous step per local step of every peer: data parallelism's
computation). Peer 3 runs with TESSERA_SWARM_POISON (atom/poison.h): scale (x 1000), flip (the
sign), noise (Gaussian of its contribution's norm), stale (its first round's contribution, every
round), ascent (-1000 x: gradient ascent outweighing the others). The honest run is peers 0-2 alone with target 48: the same samples from the honest peers,
which is what a rule that removed the poison entirely would train on. Reports each case's final
validation loss (peer 0's: the members hold the same parameters) and its distance from the honest
run's, and the rounds in which the poisoned peer was an outlier (peer 0's log). Writes OUT.json,
OUT.md and OUT.svg (each case's loss against the honest run's). A run under the mean may diverge
and stop on a non-finite gradient: its loss is written as nan.
"""
import argparse
import json
import os
import re
import shutil
import tempfile

from results_file import write_results
from swarm_peers import last, prepared_corpus, run_swarm


def log_figures(run_dir):
    """From RUN_DIR.log: the rounds whose line names at least one outlier, and the median of the
    rounds' durations ("round N: ... in S s"; None under DiLoCo, whose lines say "outer step")."""
    with open(run_dir + ".log") as f:
        text = f.read()
    outliers = len(re.findall(r"swarm: round \d+ under \S+: \d+ outlier", text))
    times = sorted(float(t) for t in re.findall(r"swarm: round \d+: .* in ([0-9.e-]+) s", text))
    return outliers, (times[len(times) // 2] if times else None)


def svg(results, rules, poisons, honest, path):
    width, height, left, top, bottom = 760, 330, 60, 30, 60
    losses = [r["val_loss"] for r in results.values()] + [honest]
    finite = [x for x in losses if x == x and x < 1e9]
    hi = min(max(finite), 1.4 * honest) * 1.02  # a diverged case is cut off at the top, its value written
    lo = min(finite) * 0.97  # the differences are a few percent: the axis starts near them
    plot_w, plot_h = width - left - 20, height - top - bottom
    group = plot_w / len(poisons)
    bar = group * 0.8 / len(rules)
    colors = ["#999999", "#1f77b4", "#2ca02c", "#ff7f0e"]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">Validation loss with one of four peers poisoned, by rule '
           '(dashed: the three honest peers alone)</text>' % left]

    def y(v):
        return top + plot_h * (1 - (min(v, hi) - lo) / (hi - lo))
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>' % (left, width - 20, y(v), y(v)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (left - 5, y(v) + 4, v))
    for i, poison in enumerate(poisons):
        x0 = left + i * group + group * 0.1
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (left + (i + 0.5) * group,
                                                                             height - bottom + 18, poison))
        for j, rule in enumerate(rules):
            r = results.get("%s/%s" % (poison, rule))
            if r is None:
                continue
            v = r["val_loss"]
            h = y(lo) - y(v) if v == v else 0
            out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %.4f</title></rect>'
                       % (x0 + j * bar, y(v), bar * 0.95, h, colors[j % len(colors)], poison, rule, v))
            if v != v or v >= hi:
                out.append('<text x="%.1f" y="%.1f" font-size="10">%s</text>' % (x0 + j * bar, top + 12,
                                                                                  "nan" if v != v else "%.1f" % v))
    out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="6,4"/>'
               % (left, width - 20, y(honest), y(honest)))
    for j, rule in enumerate(rules):
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (left + 150 * j, height - 22, colors[j % len(colors)], left + 150 * j + 16, height - 12, rule))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def render(measured, out):
    rules, poisons, honest = measured["rules"], measured["poisons"], measured["honest"]["val_loss"]
    results = measured["results"]
    svg(results, rules, poisons, honest, out + ".svg")
    lines = ["# ATOM swarm under poison (CPU, loopback)", "",
             "`%s`" % measured["command"], "",
             ("Four batch-mode peers of tiny_gpt, %d swarm steps of 16 x 4 samples, %s; peer 3 poisoned. "
              "Honest: peers 0-2 alone (target 48), the same honest samples: validation loss %.4f."
              if measured.get("sync", "batch") == "batch" else
              "Four DiLoCo peers of tiny_gpt (int8 pseudo-gradients every 10 local steps), %d local steps of 16 "
              "samples each, %s; peer 3 poisoned. Honest: peers 0-2 alone: validation loss %.4f.")
             % (measured["steps"], measured["optim"], honest), "",
             "| poison | rule | val loss | vs honest | rounds with an outlier (of %d) | median round (s, peer 0) |"
             % (measured["steps"] // (10 if measured.get("sync") == "diloco" else 1)),
             "|---|---|---|---|---|---|"]
    for poison in poisons:
        for rule in rules:
            r = results.get("%s/%s" % (poison, rule))
            if r is None:
                continue
            v = r["val_loss"]
            round_s = "-" if r.get("round_s") is None else "%.3f" % r["round_s"]
            loss = ("%.4f | %+.1f%%" % (v, 100 * (v / honest - 1)) if v == v
                    else "diverged | the run stopped on a non-finite gradient")
            lines.append("| %s | %s | %s | %d | %s |" % (poison, rule, loss, r["outlier_rounds"], round_s))
    lines += ["", "![validation loss by poison and rule](%s.svg)" % os.path.basename(out)]
    write_results(out + ".md", lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rules", default="mean,centered_clip,trimmed_mean")
    ap.add_argument("--poisons", default="none,scale,flip,noise,stale")
    ap.add_argument("--optim", default="adamw", help="optim.name of every peer")
    ap.add_argument("--sync", default="batch",
                    help="batch, or diloco (int8 pseudo-gradients every 10 local steps; --steps local steps)")
    ap.add_argument("--out", default="bench/results/swarm_poison_cpu")
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md and OUT.svg from OUT.json")
    ap.add_argument("--add", action="store_true",
                    help="run --poisons x --rules and add them to OUT.json's cases, keeping its honest run")
    a = ap.parse_args()
    if a.render:
        with open(a.out + ".json") as f:
            render(json.load(f), a.out)
        return
    data = prepared_corpus(a.build)
    batch = 16
    common = ["--set", "data.path=" + data, "--set", "train.steps=%d" % a.steps, "--set", "train.batch_size=%d" % batch,
              "--set", "eval.every=1000000", "--set", "checkpoint.every=1000000", "--set", "train.threads=1",
              "--set", "optim.warmup_steps=10", "--set", "optim.name=" + a.optim, "--set", "swarm.sync=" + a.sync]
    if a.sync == "diloco":
        common += ["--set", "swarm.inner_steps=10", "--set", "swarm.pseudo_gradient_dtype=int8"]
    work = tempfile.mkdtemp(prefix="swarm_poison_")
    rules, poisons = a.rules.split(","), a.poisons.split(",")
    command = "python3 bench/swarm_poison.py BUILD --steps %d --rules %s --poisons %s --optim %s --sync %s" % (
        a.steps, a.rules, a.poisons, a.optim, a.sync)
    if a.add:
        with open(a.out + ".json") as f:
            measured = json.load(f)
        if (measured["steps"], measured["optim"]) != (a.steps, a.optim):
            raise SystemExit("--add: OUT.json ran %d steps of %s" % (measured["steps"], measured["optim"]))
        measured["command"] += "; then " + command + " --add"
        measured["poisons"] += [p for p in poisons if p not in measured["poisons"]]
        measured["rules"] += [r for r in rules if r not in measured["rules"]]
    else:
        measured = {"command": command, "steps": a.steps, "optim": a.optim, "sync": a.sync, "rules": rules,
                    "poisons": poisons, "results": {}}
        dirs, seconds = run_swarm(a.build, work, "honest", 3,
                                  common + ["--set", "swarm.target_batch_size=%d" % (3 * batch)])
        measured["honest"] = {"val_loss": last(dirs[0], "val_loss"), "seconds": seconds}
        print("honest: val loss %.4f (%.0f s)" % (measured["honest"]["val_loss"], seconds), flush=True)
    for poison in poisons:
        for rule in rules:
            envs = {} if poison == "none" else {3: {"TESSERA_SWARM_POISON": poison}}
            dirs, seconds = run_swarm(a.build, work, "%s_%s" % (poison, rule), 4,
                                      common + ["--set", "swarm.target_batch_size=%d" % (4 * batch),
                                                "--set", "swarm.aggregation=" + rule], envs, may_fail=rule == "mean")
            loss = last(dirs[0], "val_loss")  # None where the run stopped on a non-finite gradient
            outliers, round_s = log_figures(dirs[0])
            r = {"val_loss": float("nan") if loss is None else loss, "outlier_rounds": outliers,
                 "seconds": seconds, "round_s": round_s}
            measured["results"]["%s/%s" % (poison, rule)] = r
            print("%-6s %-14s val loss %.4f, %d rounds with an outlier (%.0f s)"
                  % (poison, rule, r["val_loss"], r["outlier_rounds"], seconds), flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(measured, f, indent=1)
    render(measured, a.out)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
