#!/usr/bin/env python3
"""Expert load of an MoE run as one SVG heat map, from its metrics.jsonl (no plotting library).

Usage: plot_expert_load.py RUN_DIR --out FILE.svg [--title TEXT]

One row per (MoE layer, expert), one column per logged step; a cell's colour is the expert's load
that step over the layer's mean load: blue below the mean, white at it, red above (2x and more is
full red). The right margin gives each layer's last MaxVio (max load / mean - 1). The trainer logs
the loads under "moe" in each logged line (docs/moe.md).
"""
import argparse
import json
import pathlib

CELL_W, CELL_H = 8, 10
LEFT, TOP, RIGHT, BOTTOM = 110, 40, 150, 40


def read_loads(path):
    steps, layers = [], {}
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "moe" not in row:
            continue
        steps.append(row["step"])
        for entry in row["moe"]:
            layers.setdefault(entry["layer"], []).append((entry["load"], entry["max_violation"]))
    return steps, layers


def colour(ratio):
    """Blue (0) -> white (1) -> red (>= 2)."""
    if ratio < 1:
        t = max(ratio, 0.0)
        return f"rgb({int(40 + 215 * t)},{int(90 + 165 * t)},255)"
    t = min(ratio - 1.0, 1.0)
    return f"rgb(255,{int(255 - 205 * t)},{int(255 - 215 * t)})"


def plot(run_dir, out, title):
    steps, layers = read_loads(pathlib.Path(run_dir) / "metrics.jsonl")
    if not steps:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no MoE loads (model.ffn = moe logs them)")
    experts = len(next(iter(layers.values()))[0][0])
    rows = len(layers) * experts + len(layers) - 1
    width = LEFT + CELL_W * len(steps) + RIGHT
    height = TOP + CELL_H * rows + BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{LEFT}" y="20" font-size="14">{title}</text>']
    y = TOP
    for layer, history in sorted(layers.items()):
        parts.append(f'<text x="8" y="{y + CELL_H * experts / 2 + 4}">layer {layer}</text>')
        for e in range(experts):
            parts.append(f'<text x="{LEFT - 8}" y="{y + CELL_H - 2}" text-anchor="end" font-size="9">e{e}</text>')
            for i, (load, _) in enumerate(history):
                mean = sum(load) / len(load) or 1.0
                parts.append(f'<rect x="{LEFT + CELL_W * i}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
                             f'fill="{colour(load[e] / mean)}"/>')
            y += CELL_H
        parts.append(f'<text x="{LEFT + CELL_W * len(steps) + 8}" y="{y - CELL_H * experts / 2 + 4}">'
                     f'MaxVio {history[-1][1]:.2f}</text>')
        y += CELL_H
    parts.append(f'<text x="{LEFT}" y="{height - 14}">steps {steps[0]} to {steps[-1]} (one column per logged step); '
                 f'blue: below the mean load, white: at it, red: 2x and above</text>')
    parts.append("</svg>")
    pathlib.Path(out).write_text("\n".join(parts))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="expert load")
    args = parser.parse_args()
    print(plot(args.run_dir, args.out, args.title))


if __name__ == "__main__":
    main()
