#!/usr/bin/env python3
"""Where ZB-V's time goes at pp 2 with 16 micro-batches (or --micro-batches M), against 1F1B (issue 26),
one process per core.

The zero-bubble schedules buy a smaller bubble with a split backward (I, then W later). At 16
micro-batches 1F1B's bubble is already small (about 7.5%), so what the split costs decides whether
ZB-V wins. This runs, ROUNDS rounds with the runs of a round interleaved, each keeping its best
median step:
  1f1b, zbh1, zbv            as `tessera bench` runs them;
  interleaved                the same 2-block chunks as ZB-V, with a fused backward B;
  interleaved, split         interleaved's own table with every B(s, j) replaced by I(s, j), its
                             send, then W(s, j) at once (parallel.pp_schedule = file:): the split's
                             cost with nothing deferred, so I + W against B is the split's own cost and
                             ZB-V's I + W against it is what deferring W (cold operands) adds.
  zbh1, zbv, baseline         ZB-H1 and ZB-V as BASELINE_BUILD runs them (--baseline), to measure a change.
Per row: the best median step, tokens/s against 1F1B, 1F1B's step over the row's in each round (the
mean and spread: this shared machine's speed drifts between rounds more than between the runs of
one), the measured bubble, the mean F, B, I, W (ms) and the compute per rank and micro-batch (the
busy share of the measured step over M). Written to bench/results/pipeline_zb_m16_cpu.md, above
the sections that earlier sessions added to it.

usage: bench/pipeline_zb_m16.py BUILD_DIR [--rounds 5] [--baseline BASELINE_BUILD] [--micro-batches 16]
(with M other than 16 written to pipeline_zb_m<M>_cpu.md)
"""
import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_split import TINY  # noqa: E402
from tessera_bench import tessera_bench  # noqa: E402


def split_table(build, path, M):
    """Interleaved's table at pp 2 with each B turned into I, its SEND_B, then W."""
    csv = Path(path).with_suffix(".interleaved.csv")
    subprocess.run([str(Path(build) / "tessera"), "pipeline", "--schedule", "interleaved", "--pp", "2",
                    "--microbatches", str(M), "--csv", str(csv)], check=True, capture_output=True)
    rows = []
    for row in csv.read_text().split():
        out, pending = [], None
        for a in row.split(","):
            if pending and a != pending[1]:
                out.append(pending[0])
                pending = None
            b = re.fullmatch(r"(\d+)B(\d+)", a)
            if b:
                out.append(f"{b[1]}I{b[2]}")
                pending = (f"{b[1]}W{b[2]}", f"{b[1]}SEND_B{b[2]}")
                continue
            out.append(a)
            if pending and a == pending[1]:
                out.append(pending[0])
                pending = None
        if pending:
            out.append(pending[0])
        rows.append(",".join(out))
    Path(path).write_text("\n".join(rows) + "\n")
    return path


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--rounds", type=int, default=5)
    a.add_argument("--baseline", help="another build's directory: its ZB-H1 and ZB-V as two more rows")
    a.add_argument("--micro-batches", type=int, default=16)
    args = a.parse_args()
    M = args.micro_batches
    table = split_table(args.build, "/tmp/tessera_interleaved_split.csv", M)
    cases = {"1f1b": {"parallel.pp_schedule": "1f1b"},
             "zbh1": {"parallel.pp_schedule": "zbh1"},
             "zbv": {"parallel.pp_schedule": "zbv"},
             "interleaved": {"parallel.pp_schedule": "interleaved"},
             "interleaved, split": {"parallel.pp_schedule": f"file:{table}", "parallel.pp_virtual": 2}}
    if args.baseline:
        cases["zbh1, baseline"] = {"parallel.pp_schedule": "zbh1"}
        cases["zbv, baseline"] = {"parallel.pp_schedule": "zbv"}
    best, steps = {}, {name: [] for name in cases}
    for r in range(args.rounds):
        for name, extra in cases.items():
            sets = dict(TINY, **{"parallel.pp": 2, "train.grad_accum": M}, **extra)
            build = args.baseline if name.endswith(", baseline") else args.build
            got = tessera_bench(build, "tiny_gpt", sets, ranks=2, steps=5, warmup=2,
                                flags=("--out", "/tmp/tessera-pipeline-zb"))
            steps[name].append(got["median_step_s"])
            if name not in best or got["median_step_s"] < best[name]["median_step_s"]:
                best[name] = got
            print(r, name, got["median_step_s"], {k: round(v, 2) for k, v in got["pp_action_ms"].items()}, flush=True)
    base = best["1f1b"]["median_step_s"]
    command = f"python3 bench/pipeline_zb_m16.py build --rounds {args.rounds}" + (
        " --baseline BASELINE_BUILD" if args.baseline else "") + (f" --micro-batches {M}" if M != 16 else "")
    lines = [f"# ZB-V at pp 2, {M} micro-batches: the bubble it saves against what its split costs (CPU)", "",
             f"Command: `{command}`. tiny_gpt widened to 8 blocks "
             f"of 128, {M} micro-batches of 4 x 128 tokens, two processes, one per core, one intra-op thread each. "
             f"Best median step of {args.rounds} rounds (runs interleaved within a round); 1F1B's step over the "
             "row's in each round, mean (sd); every round's median in the last column. Compute: the busy share of "
             f"the measured step (1 - bubble) over the {M} micro-batches, per rank.", "",
             "| schedule | step s | vs 1F1B | 1F1B / it per round | bubble | F ms | B ms | I ms | W ms | "
             "compute per rank and micro-batch ms | rounds' steps s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, got in best.items():
        ms = got["pp_action_ms"]
        bubble = got["pp_bubble"]
        compute = (1 - bubble["measured"]) * bubble["measured_step_s"] / M
        ratios = [a / b for a, b in zip(steps["1f1b"], steps[name])]
        cell = lambda k: f"{ms[k]:.2f}" if k in ms else "-"  # noqa: E731
        lines.append(f"| {name} | {got['median_step_s']:.3f} | {base / got['median_step_s']:.2f}x | "
                     f"{statistics.mean(ratios):.3f} ({statistics.pstdev(ratios):.3f}) | "
                     f"{100 * bubble['measured']:.1f}% | {cell('F')} | {cell('B')} | {cell('I')} | {cell('W')} | "
                     f"{1000 * compute:.2f} | {', '.join(f'{s:.3f}' for s in steps[name])} |")
    out = Path(__file__).resolve().parent / "results" / f"pipeline_zb_m{M}_cpu.md"
    earlier = out.read_text() if out.exists() else ""
    sections = re.search(r"^## ", earlier, re.M)  # what earlier sessions added, kept below the new table
    out.write_text("\n".join(lines) + "\n" + ("\n" + earlier[sections.start():] if sections else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
