#!/usr/bin/env python3
"""The planner's price of the activation policy against runs on this machine (issues 50, 53).

tiny_gpt, float32, one process, batch 16. For each activation share (MiB of the budget left after
the model's state), modelled link and allowed codec, `tessera plan` (every layout key held, on
CLUSTER) predicts the step under `memory.activation_policy = auto` and the resident step, and
`tessera bench` runs both, ROUNDS rounds (each policy run after its resident run). Compared: the
policy's step over the resident one, predicted and measured (median over rounds), and the run's
choices. The runs set nothing in the prediction.
Written to bench/results/plan_policy_cpu.md.

usage: bench/plan_policy_here.py BUILD_DIR [--rounds 2] [--steps 5] [--shares 48,32,20] [--links 16,0.05]
                                 [--compressions none int8 bf16,int8] [--cluster this_machine_2core]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from tessera_bench import device_model_state, plan_step, tessera_bench  # noqa: E402

MIB = 1024 * 1024
GIB = 1024 * MIB
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--shares", default="48,32,20")
    ap.add_argument("--links", default="16,0.05")
    ap.add_argument("--compressions", nargs="+", default=["none", "int8"],
                    help="allowances in turn: none, a codec, or a comma-separated list of codecs")
    ap.add_argument("--cluster", default="this_machine_2core")
    ap.add_argument("--out", default="bench/results/plan_policy_cpu.md")
    args = ap.parse_args()
    base = {"train.batch_size": 16}
    state = device_model_state(args.build, "tiny_gpt", base)
    resident_predicted = plan_step(args.build, "tiny_gpt", args.cluster, base)
    lines = ["# The planner's price of the activation policy against runs (tiny_gpt, CPU)", "",
             f"`python3 bench/plan_policy_here.py {args.build} --rounds {args.rounds} --steps {args.steps} --shares "
             f"{args.shares} --links {args.links} --compressions {' '.join(args.compressions)} --cluster {args.cluster}`: one "
             "process, float32, batch 16; `tessera plan` with every layout key held against `tessera bench`, each "
             "policy run after a resident run.", "",
             "| share MiB | link GB/s | codec allowed | run's choices | predicted step / resident | measured | "
             "error of the step |",
             "|---|---|---|---|---|---|---|"]
    for link in args.links.split(","):
        for share in args.shares.split(","):
            for codec in args.compressions:
                sets = {**base, "memory.activation_policy": "auto",
                        "memory.device_budget_gb": (state + float(share) * MIB) / GIB,
                        "memory.modelled_bandwidth_gbps": link, "memory.activation_compression": codec}
                predicted = plan_step(args.build, "tiny_gpt", args.cluster, sets) / resident_predicted
                ratios, chosen = [], []
                for _ in range(args.rounds):
                    resident = tessera_bench(args.build, "tiny_gpt", {**base, "memory.modelled_bandwidth_gbps": link},
                                             steps=args.steps)
                    run = tessera_bench(args.build, "tiny_gpt", sets, steps=args.steps)
                    ratios.append(run["median_step_s"] / resident["median_step_s"])
                    chosen = [b["option"] for b in run["activation_policy"]["blocks"]]
                measured = statistics.median(ratios)
                lines.append(f"| {share} | {link} | {codec} | {', '.join(chosen)} | "
                             f"{predicted:.3f} | {measured:.3f} | {100 * (predicted / measured - 1):+.1f}% |")
                print(lines[-1], flush=True)
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
