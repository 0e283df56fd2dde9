#!/usr/bin/env python3
"""Hierarchical expert dispatch against the all-to-all: bytes between nodes and step time, on two
emulated nodes of two ranks.

    python3 bench/expert_dispatch.py BUILD_DIR [--rounds 2] [--steps 6] [--rates none,1gbit,100mbit]
        [--out bench/results/expert_dispatch_cpu]

tiny_deepseek (4 blocks, the first dense; 16 routed experts of width 64, top 4, sigmoid scores, one
shared expert; C = 128), 8 x 128 tokens per rank per step, four ranks, parallel.ep = 4, one
thread each, under two routings:
  node-limited  model.moe_groups = 2, moe_topk_groups = 1: the groups are the two nodes' experts,
                so a token's four experts lie on one node (DeepSeek-V3's node-limited routing);
  unlimited     model.moe_groups = 1: a token's four experts anywhere;
and two dispatches (parallel.ep_dispatch): alltoall (each choice's row to its expert's rank) and
hierarchical (each token once per node, then once per rank; parallel/expert/hierarchical_dispatch.h).
Part 1, loopback: `tessera bench --nproc 4 --set parallel.ranks_per_node=2`; reported per run:
rank 0's all-to-all bytes per step to the other node and in all (the ep group's counters), and
the median step. Part 2 (root only; --rates): the two nodes are two network namespaces
(atom_slow_links.Hosts: a bridge, each host's link limited to R by tbf), two ranks in each,
started as torchrun would start them (LOCAL_WORLD_SIZE = 2, parallel.ranks_per_node left 0: the
launcher's); reported: the median step at each rate. Best median over --rounds rounds, modes
alternating. Writes OUT.json and OUT.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from tessera_bench import tessera_bench

MODEL = {"model.preset": "tiny_deepseek", "train.batch_size": 8, "train.seq_len": 128, "train.threads": 1,
         "optim.name": "adamw", "parallel.ep": 4, "data.path": "unused"}
ROUTINGS = {"node-limited": {"model.moe_groups": 2, "model.moe_topk_groups": 1},
            "unlimited": {"model.moe_groups": 1, "model.moe_topk_groups": 0}}
DISPATCHES = ("alltoall", "hierarchical")


def loopback(build, rounds, steps):
    best = {}
    for r in range(rounds):
        for routing, sets in ROUTINGS.items():
            for dispatch in DISPATCHES:
                res = tessera_bench(build, "tiny_gpt", {**MODEL, **sets, "parallel.ep_dispatch": dispatch,
                                                        "parallel.ranks_per_node": 2}, 4, steps, 2)
                key = (routing, dispatch)
                print(f"round {r + 1} {routing} {dispatch}: {res['median_step_s']:.4f} s, "
                      f"{res['ep_inter_node_bytes_per_step'] / 1e6:.2f} MB to the other node", flush=True)
                if key not in best or res["median_step_s"] < best[key]["median_step_s"]:
                    best[key] = res
    return best


def on_two_hosts(build, sets, steps, port):
    """Rank 0's `tessera bench --json` of four ranks, two in each of namespaces tsr0 and tsr1."""
    from atom_slow_links import host_ip
    cmd = [os.path.join(build, "tessera"), "bench", "--config", "tiny_gpt", "--json", "--steps", str(steps),
           "--warmup", "2"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    procs = []
    for rank in range(4):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR=host_ip(0), MASTER_PORT=str(port))
        procs.append(subprocess.Popen(["ip", "netns", "exec", "tsr%d" % (rank // 2)] + cmd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("\n".join(o[-1500:] for o in outs))
    return json.loads(outs[0].strip().splitlines()[-1])


def slow_links(build, rates, rounds, steps):
    from atom_slow_links import Hosts
    hosts = Hosts(2)
    best, port = {}, 29610
    for rate in rates:
        hosts.set_rate(rate)
        for r in range(rounds):
            for routing, sets in ROUTINGS.items():
                for dispatch in DISPATCHES:
                    port += 1
                    res = on_two_hosts(build, {**MODEL, **sets, "parallel.ep_dispatch": dispatch}, steps, port)
                    key = (rate, routing, dispatch)
                    print(f"{rate} round {r + 1} {routing} {dispatch}: {res['median_step_s']:.4f} s", flush=True)
                    if key not in best or res["median_step_s"] < best[key]["median_step_s"]:
                        best[key] = res
    hosts.close()
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rates", default="none,1gbit,100mbit", help="part 2's link rates; empty: skip part 2")
    ap.add_argument("--out", default="bench/results/expert_dispatch_cpu")
    a = ap.parse_args()
    rates = [r for r in a.rates.split(",") if r]
    if rates and os.geteuid() != 0:
        sys.exit("expert_dispatch.py: part 2 needs root (ip netns, tc); run with sudo or --rates ''")
    here = loopback(a.build, a.rounds, a.steps)
    linked = slow_links(a.build, rates, a.rounds, a.steps) if rates else {}

    lines = [f"# Hierarchical expert dispatch on two emulated nodes ({time.strftime('%Y-%m-%d')})", "",
             f"`python3 bench/expert_dispatch.py build --rounds {a.rounds} --steps {a.steps} --rates {a.rates}`: "
             "tiny_deepseek (16 experts top 4, C = 128, 3 MoE blocks), four ranks, ep = 4, two nodes of two "
             "ranks, 8 x 128 tokens per rank per step, one thread per rank; best median step over the rounds.", "",
             "## Loopback (parallel.ranks_per_node = 2): rank 0's all-to-all bytes per step", "",
             "| routing | dispatch | to the other node MB | all MB | step s |", "|---|---|---|---|---|"]
    rows = []
    for (routing, dispatch), res in here.items():
        inter, total = res["ep_inter_node_bytes_per_step"], res["ep_bytes_per_step"].get("all_to_all", 0.0)
        rows.append({"part": "loopback", "routing": routing, "dispatch": dispatch, "inter_node_bytes": inter,
                     "all_to_all_bytes": total, "step_s": res["median_step_s"]})
        lines.append(f"| {routing} | {dispatch} | {inter / 1e6:.2f} | {total / 1e6:.2f} | {res['median_step_s']:.4f} |")
    for routing in ROUTINGS:
        a2a, hier = here[(routing, "alltoall")], here[(routing, "hierarchical")]
        lines.append("")
        lines.append(f"{routing}: hierarchical sends {hier['ep_inter_node_bytes_per_step'] / a2a['ep_inter_node_bytes_per_step']:.2f}x "
                     "the all-to-all's bytes to the other node.")
    if linked:
        lines += ["", "## Two network namespaces, two ranks each, each host's link limited to the rate (tbf)", "",
                  "| rate | routing | alltoall step s | hierarchical step s | hierarchical / alltoall |",
                  "|---|---|---|---|---|"]
        for rate in rates:
            for routing in ROUTINGS:
                a2a, hier = linked[(rate, routing, "alltoall")], linked[(rate, routing, "hierarchical")]
                for dispatch, res in ((("alltoall", a2a), ("hierarchical", hier))):
                    rows.append({"part": "namespaces", "rate": rate, "routing": routing, "dispatch": dispatch,
                                 "step_s": res["median_step_s"],
                                 "inter_node_bytes": res["ep_inter_node_bytes_per_step"]})
                lines.append(f"| {rate} | {routing} | {a2a['median_step_s']:.4f} | {hier['median_step_s']:.4f} | "
                             f"{hier['median_step_s'] / a2a['median_step_s']:.2f} |")
    meta = {"date": time.strftime("%Y-%m-%d"), "model": MODEL, "routings": ROUTINGS, "rounds": a.rounds,
            "steps": a.steps, "rates": rates}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
