#!/usr/bin/env python3
"""Where the time of the PyTorch twin's training step goes (bench/pytorch_twin.py, eager), and the
per-op diff against tessera's (BUILD/tessera_profile_step --json, bench/profile_step.cpp).

Usage:
  profile_pytorch_twin.py [--case tiny_gpt] [--threads 2] [--steps 10]            per-op table of the peer
  profile_pytorch_twin.py --diff TESSERA.json [--top 30]                          both sides, op by op
  profile_pytorch_twin.py --timing                                                CPU s, wall s, page faults per step

The per-op table comes from torch.profiler over --steps steps after --warmup unrecorded ones: per
op name, calls per step, self time and total time per step, as tessera_profile_step reports them.
The diff lists every op whose calls per step differ between the sides (marked *) and the --top ops
by self time of either side, so extra ops, extra copies and different kernels stand out. --timing
records nothing and prints the same JSON fields as `tessera_profile_step --timing`.

A like-for-like session (tiny_gpt, two threads):
  build/tessera_profile_step --config tiny_gpt --set train.threads=2 --json > /tmp/tessera_ops.json
  python3 bench/profile_pytorch_twin.py --threads 2 --diff /tmp/tessera_ops.json
"""
import argparse
import json
import pathlib
import resource
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare_pytorch import CASES  # noqa: E402
from pytorch_twin import GPT  # noqa: E402


def make_step(case, threads):
    """The peer's training step on the case's shapes, exactly as pytorch_twin.py runs it."""
    c = CASES[case]
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    model = GPT(c["vocab"], c["block"], c["layers"], c["heads"], c["embd"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    tokens = torch.randint(c["vocab"], (c["batch"], c["seq"] + 1), generator=torch.Generator().manual_seed(1))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timing(step, steps):
    cpu, wall = [], []
    faults0 = minor_faults()
    for _ in range(steps):
        c0, w0 = time.thread_time(), time.perf_counter()
        step()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"peer": "pytorch-eager", "threads": torch.get_num_threads(), "cpu_s_min": min(cpu),
            "cpu_s_median": sorted(cpu)[len(cpu) // 2], "wall_s_min": min(wall),
            "wall_s_median": sorted(wall)[len(wall) // 2], "page_faults_per_step": (minor_faults() - faults0) / steps}


def op_profile(step, steps):
    faults0 = minor_faults()
    with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof:
        for _ in range(steps):
            step()
    faults = (minor_faults() - faults0) / steps
    ops = {e.key: {"calls": e.count / steps, "self_us": e.self_cpu_time_total / steps,
                   "total_us": e.cpu_time_total / steps} for e in prof.key_averages()}
    return {"peer": "pytorch-eager", "threads": torch.get_num_threads(), "page_faults_per_step": faults, "ops": ops}


def print_diff(peer, ours, top):
    zero = {"calls": 0.0, "self_us": 0.0, "total_us": 0.0}
    p_ops, o_ops = peer["ops"], ours["ops"]
    names = set()
    for side in (p_ops, o_ops):
        names |= {k for k, _ in sorted(side.items(), key=lambda kv: -kv[1]["self_us"])[:top]}
    names |= {k for k in set(p_ops) | set(o_ops) if p_ops.get(k, zero)["calls"] != o_ops.get(k, zero)["calls"]}
    rows = sorted(names, key=lambda k: -max(p_ops.get(k, zero)["self_us"], o_ops.get(k, zero)["self_us"]))
    print(f"{'op':60} {'calls: peer':>11} {'tessera':>8} {'self us: peer':>14} {'tessera':>10}")
    for k in rows:
        p, o = p_ops.get(k, zero), o_ops.get(k, zero)
        mark = " *" if p["calls"] != o["calls"] else ""
        print(f"{k[:60]:60} {p['calls']:11.1f} {o['calls']:8.1f} {p['self_us']:14.1f} {o['self_us']:10.1f}{mark}")
    print(f"{'sum of self time (us per step)':60} {'':11} {'':8} {sum(v['self_us'] for v in p_ops.values()):14.1f} "
          f"{sum(v['self_us'] for v in o_ops.values()):10.1f}")
    print(f"{'minor page faults per step':60} {'':11} {'':8} {peer['page_faults_per_step']:14.0f} "
          f"{ours['page_faults_per_step']:10.0f}")


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--case", default="tiny_gpt", choices=sorted(CASES))
    a.add_argument("--steps", type=int, default=10)
    a.add_argument("--warmup", type=int, default=3)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--diff", help="the output of tessera_profile_step --json to compare with")
    a.add_argument("--top", type=int, default=30)
    a.add_argument("--timing", action="store_true", help="record no ops; print CPU/wall s and page faults per step")
    args = a.parse_args()
    step = make_step(args.case, args.threads)
    for _ in range(args.warmup):
        step()
    if args.timing:
        print(json.dumps(timing(step, args.steps)))
        return
    peer = op_profile(step, args.steps)
    if args.diff:
        print_diff(peer, json.loads(pathlib.Path(args.diff).read_text().strip().splitlines()[-1]), args.top)
        return
    print(f"{args.steps} steps, {peer['threads']} threads, {peer['page_faults_per_step']:.0f} minor page faults "
          f"per step; per step:")
    print(f"{'op':60} {'calls':>8} {'self us':>12} {'total us':>12}")
    for name, s in sorted(peer["ops"].items(), key=lambda kv: -kv[1]["self_us"])[:args.top]:
        print(f"{name[:60]:60} {s['calls']:8.1f} {s['self_us']:12.1f} {s['total_us']:12.1f}")


if __name__ == "__main__":
    main()
