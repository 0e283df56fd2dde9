#!/usr/bin/env python3
"""Loss curves of tessera runs as one SVG picture, from their metrics.jsonl (no plotting library).

Usage: plot_losses.py RUN_DIR[=LABEL] ... --out FILE.svg [--title TEXT] [--baseline NATS]

Each run contributes its training loss (thin line, one point per logged interval) and, where the
run evaluated, its validation loss (thick line with dots), in one colour per run. --baseline draws
a dashed horizontal line (e.g. the unigram entropy the trainer prints). Also importable:
plot(runs, out, title, baseline, events) with runs = [(label, metrics_path), ...] and events =
[(step, label), ...] drawn as labelled vertical lines (bench/atom_churn.py marks peers joining and
leaving).
"""
import argparse
import json
import math
import pathlib

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 64, 190, 40, 48


def read_metrics(path):
    train, val = [], []
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "loss" in row:
            train.append((row["step"], row["loss"]))
        if "val_loss" in row:
            val.append((row["step"], row["val_loss"]))
    return train, val


def nice_ticks(lo, hi, count=6):
    span = hi - lo or 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    for step in (magnitude, 2 * magnitude, 2.5 * magnitude, 5 * magnitude, 10 * magnitude):
        if span / step <= count:
            break
    first = step * int(lo / step)
    ticks, t = [], first
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            ticks.append(round(t, 10))
        t += step
    return ticks


def plot(runs, out, title="loss", baseline=None, events=()):
    series = [(label, *read_metrics(path)) for label, path in runs]
    points = [p for _, train, val in series for p in train + val]
    if not points:
        raise SystemExit("plot_losses: no losses in " + ", ".join(str(p) for _, p in runs))
    max_step = max(s for s, _ in points)
    losses = [l for _, l in points] + ([baseline] if baseline is not None else [])
    lo, hi = min(losses), max(losses)
    hi = min(hi, lo + 3 * (sorted(losses)[len(losses) // 2] - lo) + 0.5)  # the first steps' loss would flatten the rest
    pad = 0.05 * (hi - lo or 1.0)
    lo, hi = lo - pad, hi + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step):
        return LEFT + plot_w * step / max_step

    def y(loss):
        return TOP + plot_h * (hi - min(max(loss, lo), hi)) / (hi - lo)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{LEFT}" y="24" font-size="15">{title}</text>']
    for t in nice_ticks(lo, hi):
        svg.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in nice_ticks(0, max_step):
        svg.append(f'<text x="{x(t):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{int(t)}</text>')
    svg.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>')
    svg.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">step</text>')
    svg.append(f'<text transform="translate(16 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">loss (nats)</text>')
    for k, (step, label) in enumerate(events):  # vertical lines, labels staggered down the plot
        svg.append(f'<line x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#555" '
                   f'stroke-dasharray="3 3"/><text x="{x(step) + 3:.1f}" y="{TOP + 14 + 16 * (k % 4)}" '
                   f'font-size="11" fill="#333">{label}</text>')
    if baseline is not None:
        svg.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(baseline):.1f}" y2="{y(baseline):.1f}" '
                   f'stroke="#888" stroke-dasharray="6 4"/>')
    legend_y = TOP + 8
    for i, (label, train, val) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        if train:
            path = " ".join(f"{x(s):.1f},{y(l):.1f}" for s, l in train)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1" opacity="0.6"/>')
        if val:
            path = " ".join(f"{x(s):.1f},{y(l):.1f}" for s, l in val)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
            svg += [f'<circle cx="{x(s):.1f}" cy="{y(l):.1f}" r="3" fill="{colour}"/>' for s, l in val]
        svg.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{legend_y}" y2="{legend_y}" '
                   f'stroke="{colour}" stroke-width="2.5"/><text x="{WIDTH - RIGHT + 38}" y="{legend_y + 4}">{label}</text>')
        if val:
            svg.append(f'<text x="{WIDTH - RIGHT + 38}" y="{legend_y + 19}" fill="#666">val {val[-1][1]:.3f}</text>')
        legend_y += 38 if val else 20
    notes = ["thin: training", "thick: validation"] + ([f"dashed: unigram {baseline:.2f}"] if baseline is not None else [])
    for i, note in enumerate(notes):
        svg.append(f'<text x="{WIDTH - RIGHT + 12}" y="{legend_y + 10 + 16 * i}" fill="#666">{note}</text>')
    svg.append("</svg>")
    pathlib.Path(out).write_text("\n".join(svg) + "\n")


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    a.add_argument("--out", required=True)
    a.add_argument("--title", default="loss")
    a.add_argument("--baseline", type=float)
    args = a.parse_args()
    runs = []
    for spec in args.runs:
        directory, _, label = spec.partition("=")
        runs.append((label or pathlib.Path(directory).name, pathlib.Path(directory) / "metrics.jsonl"))
    plot(runs, args.out, args.title, args.baseline)
    print(args.out)


if __name__ == "__main__":
    main()
