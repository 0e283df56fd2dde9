#!/usr/bin/env python3
"""PyTorch's own pipeline tables through tessera's simulator, beside tessera's tables, at the same
unit costs.

For each schedule both have, PyTorch's generated per-rank action order (`pipeline_order` of its
schedule class, built in one process on a fake process group: nothing runs) is written as a
compute-only CSV table (a DualPipeV overlapped F/B pair as its two actions in order; the gradient
reductions PyTorch adds are dropped) and replayed by `tessera pipeline --schedule file:...` with F 1,
B 2, I 1, W 1 and no transfer time; tessera's own table runs through the same simulator. The bubble
is the idle share of pp x step time. Written to bench/results/pytorch_schedule_tables.md.

usage: bench/pytorch_schedule_tables.py BUILD_DIR
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import pipelining as pl
from torch.testing._internal.distributed.fake_pg import FakeStore

# tessera name, PyTorch class, placement (loop or v), stages per rank
SCHEDULES = [("gpipe", "ScheduleGPipe", "loop", 1), ("1f1b", "Schedule1F1B", "loop", 1),
             ("interleaved", "ScheduleInterleaved1F1B", "loop", 2),
             ("zbh1", "ScheduleInterleavedZeroBubble", "loop", 2),
             ("zbv", "ScheduleZBVZeroBubble", "v", 2), ("dualpipev", "ScheduleDualPipeV", "v", 2)]
ACTION = re.compile(r"^\d+[FBIW]\d+$")


def pytorch_rows(cls, placement, v, pp, m):
    """PyTorch's compute actions per rank, in order (rank 0's view builds every rank's)."""
    n = pp * v
    mine = [0] if v == 1 else ([0, pp] if placement == "loop" else [0, n - 1])
    stages = [pl.PipelineStage(nn.Linear(4, 4), i, n, torch.device("cpu")) for i in mine]
    schedule = getattr(pl, cls)(stages if v > 1 else stages[0], m, loss_fn=lambda out, target: out.sum())
    rows = []
    for r in range(pp):
        out = []
        for a in schedule.pipeline_order[r]:
            if a is None:
                continue
            parts = [repr(s) for s in a.sub_actions] if a.sub_actions else [repr(a)]
            out += [p for p in parts if ACTION.match(p)]
        rows.append(out)
    return rows


def simulate(build, schedule, pp, m, v, vee):
    cmd = [str(Path(build) / "tessera"), "pipeline", "--schedule", schedule, "--pp", str(pp), "--microbatches", str(m),
           "--virtual", str(v)]
    if vee:
        cmd.append("--vee")
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"step time ([\d.]+); bubble ([\d.]+)%", out.stdout)
    if not found:
        errors = [l for l in (out.stdout + out.stderr).splitlines() if l.startswith("error:")]
        return None, "refused: " + (errors[-1].split("): ", 1)[-1] if errors else "no result")
    return (float(found.group(1)), float(found.group(2))), None


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    lines = ["# PyTorch's pipeline tables in tessera's simulator", "",
             f"Command: `python3 bench/pytorch_schedule_tables.py {build}` (torch {torch.__version__}). Unit costs F 1, "
             "B 2, I 1, W 1, no transfer time; bubble = idle share of pp x step time. PyTorch has no ZB-H1: its "
             "interleaved zero-bubble (ScheduleInterleavedZeroBubble, 2 stages per rank) stands beside tessera's "
             "ZB-H1 (1 stage per rank) there. A table tessera's validator refuses is named with its reason.", "",
             "| pp | m | schedule | tessera step | tessera bubble | PyTorch class | PyTorch step | PyTorch bubble |",
             "|---|---|---|---|---|---|---|---|"]
    tmp = Path(tempfile.mkdtemp(prefix="pytorch-tables-"))
    for pp in (2, 4):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=pp)
        for m in (8, 16):
            for name, cls, placement, v in SCHEDULES:
                ours, why = simulate(build, name, pp, m, 2 if name in ("interleaved", "zbv", "dualpipev") else 1,
                                     False)
                csv = tmp / f"{cls}_pp{pp}_m{m}.csv"
                try:
                    rows = pytorch_rows(cls, placement, v, pp, m)
                    csv.write_text("\n".join(",".join(r) for r in rows) + "\n")
                    theirs, their_why = simulate(build, f"file:{csv}", pp, m, v, placement == "v")
                except Exception as e:  # PyTorch refuses the combination (e.g. m too small)
                    theirs, their_why = None, f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
                cell = (lambda r, w: (f"{r[0]:g}", f"{r[1]:.2f}%") if r else ("-", w[:120]))
                o, t = cell(ours, why), cell(theirs, their_why)
                lines.append(f"| {pp} | {m} | {name} | {o[0]} | {o[1]} | {cls} | {t[0]} | {t[1]} |")
                print(lines[-1], flush=True)
        dist.destroy_process_group()
    out = Path("bench/results/pytorch_schedule_tables.md")
    out.write_text("\n".join(lines) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
