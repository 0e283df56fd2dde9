#!/usr/bin/env python3
"""tessera plan against bench/results/expert_dispatch_cpu.json: tiny_deepseek at ep = 4 on two
"hosts" (network namespaces of two ranks each, each host's link limited by tbf), alltoall and
hierarchical dispatch, node-limited and unlimited routing, at each link rate measured.

Each row is predicted from a calibration of this machine for four ranks (`tessera plan calibrate
--ranks 4`, written beside the results when missing) with two devices per node and, between the
nodes, the host link's rate that bench/atom_slow_links.py measured for the same tbf setting on
2026-11-26 (LINKS_MB_PER_S; its probe counted at the sender then), halved (two ranks share a
host's link; the planner's inter_node is per device); "none" keeps the loopback link. Nothing is
fitted to the dispatch table.

usage: bench/plan_expert_dispatch.py [--tessera build/tessera] [--calibration FILE] [--out bench/results/plan_expert_dispatch_cpu.md]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

from results_file import write_results
from tessera_bench import calibration_text

MEASURED = "bench/results/expert_dispatch_cpu.json"
# One host sending to another through a tbf link, MB/s (bench/results/atom_slow_links_cpu.json at 838b63c).
LINKS_MB_PER_S = {"1gbit": 120.51, "100mbit": 12.295, "10mbit": 1.4919}
HELD = {"model.preset": "tiny_deepseek", "train.threads": 1, "train.seq_len": 128, "train.batch_size": 8,
        "train.global_batch_size": 32, "parallel.tp": 1, "parallel.pp": 1, "parallel.sp": 1, "parallel.ep": 4,
        "parallel.zero_stage": 0, "parallel.offload": "false", "memory.activation_checkpointing": "none",
        "memory.swap": "false", "optim.name": "adamw"}
ROUTINGS = {"node-limited": {"model.moe_groups": 2, "model.moe_topk_groups": 1},
            "unlimited": {"model.moe_groups": 1, "model.moe_topk_groups": 0}}


def two_nodes(calibration, inter_gbs):
    text = re.sub(r"devices_per_node = \d+", "devices_per_node = 2", calibration)
    text = re.sub(r"nodes = \d+", "nodes = 2", text)
    if inter_gbs is None:
        return text
    return re.sub(r"(\[inter_node\]\nbandwidth_gbs = )[0-9.]+", rf"\g<1>{inter_gbs:.6g}", text)


def predict(binary, cluster, sets):
    args = [binary, "plan", "--config", "tiny_gpt", "--cluster", cluster, "--world", "4", "--top", "1", "--json"]
    for k, v in {**HELD, **sets}.items():
        args += ["--set", f"{k}={v}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["layouts"][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default="build/tessera")
    ap.add_argument("--calibration", default="bench/results/plan_expert_dispatch_calibration.toml")
    ap.add_argument("--out", default="bench/results/plan_expert_dispatch_cpu.md")
    args = ap.parse_args()
    calibration = calibration_text(args.tessera, args.calibration, 4)
    measured = json.load(open(MEASURED))
    rows = {(r["rate"], r["routing"], r["dispatch"]): r["step_s"] for r in measured["rows"] if r["part"] == "namespaces"}
    rates = measured["meta"]["rates"]
    lines = ["# tessera plan against the hierarchical dispatch table (bench/results/expert_dispatch_cpu.md)", "",
             "`python3 bench/plan_expert_dispatch.py` (its docstring says what is held): tiny_deepseek, ep = 4 on two",
             "network namespaces of two ranks each, each host's link limited by tbf. Calibration: "
             f"{args.calibration} (`tessera plan calibrate --ranks 4`); nothing fitted to the table.", "",
             "Step seconds, predicted / measured (error); the ep communication term predicted:", "",
             "| link | routing | alltoall | hierarchical | predicted ep comm a2a / hier s | choice predicted / measured |",
             "|---|---|---|---|---|---|"]
    errors, agree, total = [], 0, 0
    with tempfile.TemporaryDirectory() as d:
        for rate in rates:
            path = os.path.join(d, f"{rate}.toml")
            per_device = None if rate == "none" else LINKS_MB_PER_S[rate] / 2 / 1e3
            open(path, "w").write(two_nodes(calibration, per_device))
            for routing, sets in ROUTINGS.items():
                cells, comm, predicted_step = [], [], {}
                for dispatch in ("alltoall", "hierarchical"):
                    layout = predict(args.tessera, path, {**sets, "parallel.ep_dispatch": dispatch})
                    step = layout["step_s"]
                    predicted_step[dispatch] = step
                    real = rows[(rate, routing, dispatch)]
                    errors.append(step / real - 1)
                    cells.append(f"{step:.3f} / {real:.3f} ({(step / real - 1) * 100:+.0f}%)")
                    comm.append(dict(layout["breakdown"]).get("ep_communication", 0.0))
                pick = min(predicted_step, key=predicted_step.get)
                real_pick = min(("alltoall", "hierarchical"), key=lambda x: rows[(rate, routing, x)])
                agree += pick == real_pick
                total += 1
                lines.append(f"| {rate} | {routing} | {cells[0]} | {cells[1]} | {comm[0]:.3f} / {comm[1]:.3f} | "
                             f"{pick} / {real_pick} |")
    within = sum(1 for e in errors if abs(e) <= 0.15)
    lines += ["", f"Mean absolute error {sum(abs(e) for e in errors) / len(errors) * 100:.1f}%, worst "
              f"{max(errors, key=abs) * 100:+.0f}%, {within} of {len(errors)} within 15%; the faster dispatch "
              f"predicted in {agree} of {total} settings."]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
