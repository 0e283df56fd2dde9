#!/usr/bin/env python3
"""Activation offload against keeping the activations and against recomputing them (issue 53).

One process, float32, CONFIG (default tiny_gpt) with train.batch_size BATCH. Policies:
  resident            every block's saved activations on the device;
  full recomputation  memory.activation_checkpointing = full;
  offload L-1 @ R     memory.activation_offload = n_layer - 1 (the last block resident), the CPU
                      "device"'s link modelled at R GB/s each way (memory.modelled_bandwidth_gbps);
  offload L @ R       every block offloaded;
  offload L-1 + int8  the same with memory.activation_compression = int8.
Each round runs every policy once (`tessera bench --json`); ROUNDS rounds. Reported per policy:
  step ms            the median over rounds of each round's median step;
  step / resident    the median over rounds of the step over the same round's resident step;
  device MiB         saved_activation_bytes: what autograd held on the device at the step's peak
                     for the blocks' backward (memory/saved_activations.h);
  host MiB           saved_activation_host_bytes: the offloaded copies at their peak;
  fetch ms, waited   per step: the load stream's copy time and the time unpacks waited for it;
  hidden             1 - waited / fetch: the share of the fetches' copy time behind compute.
The last round's trace of the first offload policy at each rate is drawn as a timeline (SVG):
each block's forward, its store and fetch, the start of its backward and any wait.
Written to bench/results/activation_offload_cpu.md and activation_offload_timeline_cpu.svg.

usage: bench/activation_offload.py BUILD_DIR [--rounds 3] [--steps 5] [--config tiny_gpt] [--batch 16]
                                   [--rates 16,64]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from activation_memory import model_shape  # noqa: E402
from results_file import write_results  # noqa: E402
from tessera_bench import tessera_bench  # noqa: E402

MIB = 1024 * 1024


def policies(layers, rates):
    out = [("resident", {}), ("full recomputation", {"memory.activation_checkpointing": "full"})]
    for rate in rates:
        bw = {"memory.modelled_bandwidth_gbps": rate}
        out.append((f"offload {layers - 1} of {layers} @ {rate:g} GB/s", {"memory.activation_offload": layers - 1, **bw}))
        out.append((f"offload {layers} of {layers} @ {rate:g} GB/s", {"memory.activation_offload": layers, **bw}))
    out.append((f"offload {layers - 1} + int8 @ {rates[0]:g} GB/s",
                {"memory.activation_offload": layers - 1, "memory.activation_compression": "int8",
                 "memory.modelled_bandwidth_gbps": rates[0]}))
    return out


def timeline_svg(traces, title):
    """traces: [(label, step_s, events)]; one panel per trace, rows: compute, store, fetch."""
    width, left, row_h, panel_gap = 960, 150, 18, 26
    rows = ["compute", "store", "fetch"]
    colours = {"forward": "#4c78a8", "backward": "#e45756", "store": "#72b7b2", "fetch": "#f58518", "wait": "#b279a2"}
    longest = max(step for _, step, _ in traces)
    scale = (width - left - 20) / longest
    height = 40 + len(traces) * (len(rows) * row_h + panel_gap + 14) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="11">', f'<text x="10" y="18" font-size="13">{title}</text>']
    y = 40
    for label, step, events in traces:
        out.append(f'<text x="10" y="{y + 4}" font-weight="bold">{label} (step {1e3 * step:.1f} ms)</text>')
        y += 10
        for i, row in enumerate(rows):
            out.append(f'<text x="10" y="{y + i * row_h + 13}">{row}</text>')
        for what, group, start, end in events:
            row = {"forward": 0, "backward": 0, "wait": 0, "store": 1, "fetch": 2}[what]
            x = left + start * scale
            top = y + row * row_h + 2
            if what == "backward":  # an instant: the gradient reached the block's output
                out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + row_h - 4}" stroke="{colours[what]}" '
                           'stroke-width="2"/>')
                out.append(f'<text x="{x + 2:.1f}" y="{top + 10}" fill="{colours[what]}">b{group}</text>')
                continue
            w = max(1.0, (end - start) * scale)
            out.append(f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="{row_h - 4}" fill="{colours[what]}" '
                       f'opacity="0.85"><title>{what} group {group}: {1e3 * start:.2f}-{1e3 * end:.2f} ms</title></rect>')
            if what != "wait" and w > 14:
                out.append(f'<text x="{x + 2:.1f}" y="{top + 11}" fill="white">{group}</text>')
        y += len(rows) * row_h + panel_gap
    legend = " ".join(f'<tspan fill="{c}">&#9632; {k}</tspan>' for k, c in colours.items())
    out.append(f'<text x="10" y="{y}">{legend} (numbers: offload groups, one per block and micro-batch, as made; '
               'backward marks: the gradient reaching that block)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--config", default="tiny_gpt")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rates", default="16,64")
    ap.add_argument("--out", default="bench/results/activation_offload_cpu.md")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    layers = model_shape(args.build, args.config)[0]
    todo = policies(layers, rates)
    runs = {name: [] for name, _ in todo}
    for r in range(args.rounds):
        for name, sets in todo:
            result = tessera_bench(args.build, args.config, {"train.batch_size": args.batch, **sets}, steps=args.steps)
            runs[name].append(result)
            print(f"round {r + 1}/{args.rounds}: {name}: {1e3 * result['median_step_s']:.1f} ms", flush=True)
    lines = [f"# Activation offload against resident activations and full recomputation ({args.config}, CPU)", "",
             f"`python3 bench/activation_offload.py {args.build} --rounds {args.rounds} --steps {args.steps} "
             f"--config {args.config} --batch {args.batch} --rates {args.rates}`: one process, float32, "
             f"train.batch_size {args.batch}, {args.rounds} rounds of every policy in turn; the CPU \"device\"'s "
             "link to the host modelled at the stated rate each way (memory.modelled_bandwidth_gbps). "
             "Device and host MiB: the saved activations at their peak; fetch and waited: per step.", "",
             "| policy | step ms | step / resident | device MiB | host MiB | fetch ms | waited ms | hidden |",
             "|---|---|---|---|---|---|---|---|"]
    for name, _ in todo:
        results = runs[name]
        step = statistics.median(x["median_step_s"] for x in results)
        ratio = statistics.median(x["median_step_s"] / base["median_step_s"] for x, base in zip(results, runs["resident"]))
        device = statistics.median(x["saved_activation_bytes"] for x in results) / MIB
        off = [x.get("activation_offload") for x in results]
        if off[0]:
            host = statistics.median(x["saved_activation_host_bytes"] for x in results) / MIB
            fetch = statistics.median(o["fetch_s_per_step"] for o in off)
            waited = statistics.median(o["fetch_wait_s_per_step"] for o in off)
            extra = f"{host:.1f} | {1e3 * fetch:.1f} | {1e3 * waited:.2f} | {100 * (1 - waited / fetch):.1f}%"
        else:
            extra = "- | - | - | -"
        lines.append(f"| {name} | {1e3 * step:.1f} | {ratio:.3f} | {device:.1f} | {extra} |")
    traces = []
    for rate in rates:
        name = f"offload {layers} of {layers} @ {rate:g} GB/s"
        last = runs[name][-1]
        traces.append((name, last["median_step_s"], last["activation_offload"]["trace"]))
    svg = Path(args.out).with_name(Path(args.out).stem.replace("_cpu", "") + "_timeline_cpu.svg")
    svg.write_text(timeline_svg(traces, f"Activation offload, {args.config} batch {args.batch}: the last timed step "
                                        "(CPU device, modelled link)"))
    lines += ["", f"Timeline of the last round's step with every block offloaded: {svg.name}."]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
