#!/usr/bin/env python3
"""The activation policy under swap (plan/swap_policy.h) against the same budgets chosen by hand.

    python3 bench/swap_activation_policy.py BUILD_DIR [--budgets 0.1,0.05,0.03,0.02] [--rounds 2]
        [--out bench/results/swap_activation_policy_cpu]

tiny_gpt, batch 16 x 128, one thread, memory.swap = true over a modelled 1 GB/s link, at each
device budget (GiB): memory.activation_policy = auto, and by hand every block keeping its
activations (checkpointing none) or recomputing them (full). Reported: each run's median step
(best over the rounds), the swap plan's sub-models and planned device peak, the measured peak of
saved activations, the policy's choice, or the refusal when the plan does not fit. Writes OUT.md
and OUT.json.
"""
import argparse
import json
import time

from tessera_bench import tessera_bench

MODEL = {"train.batch_size": 16, "train.seq_len": 128, "train.threads": 1, "memory.swap": "true",
         "memory.modelled_bandwidth_gbps": 1, "data.path": "unused"}
MODES = {"auto": {"memory.activation_policy": "auto"},
         "keep (none)": {"memory.activation_checkpointing": "none"},
         "full": {"memory.activation_checkpointing": "full"}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--budgets", default="0.1,0.05,0.03,0.02")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="bench/results/swap_activation_policy_cpu")
    a = ap.parse_args()
    budgets = [float(b) for b in a.budgets.split(",")]
    best = {}
    for r in range(a.rounds):
        for budget in budgets:
            for mode, sets in MODES.items():
                key = (budget, mode)
                try:
                    res = tessera_bench(a.build, "tiny_gpt", {**MODEL, **sets, "memory.device_budget_gb": budget},
                                        1, a.steps, 2)
                except RuntimeError as e:
                    refusal = next((line for line in str(e).splitlines()
                                    if "memory.device_budget_gb" in line and "--set" not in line), str(e))
                    best[key] = {"refused": refusal.strip()[-300:]}
                    print(f"round {r + 1} {budget} {mode}: refused", flush=True)
                    continue
                print(f"round {r + 1} {budget} {mode}: {res['median_step_s']:.4f} s", flush=True)
                if key not in best or "refused" in best[key] or res["median_step_s"] < best[key]["median_step_s"]:
                    best[key] = res
    lines = [f"# The activation policy under swap against choices by hand ({time.strftime('%Y-%m-%d')})", "",
             f"`python3 bench/swap_activation_policy.py build --budgets {a.budgets} --rounds {a.rounds}`: tiny_gpt, "
             "16 x 128 tokens, one thread, memory.swap over a modelled 1 GB/s link; best median step over the rounds.",
             "", "| budget GiB | choice | step s | sub-models | planned device peak MiB | saved activations MiB | policy |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    for budget in budgets:
        for mode in MODES:
            res = best[(budget, mode)]
            if "refused" in res:
                lines.append(f"| {budget} | {mode} | refused | | | | {res['refused'][:120]} |")
                rows.append({"budget_gb": budget, "mode": mode, "refused": res["refused"]})
                continue
            swap = res["swap"]
            policy = res.get("activation_policy", {})
            choice = ", ".join(b["option"] for b in policy.get("blocks", [])) if policy else "-"
            lines.append(f"| {budget} | {mode} | {res['median_step_s']:.4f} | {len(swap['boundaries']) - 1} | "
                         f"{swap['planned_device_peak_bytes'] / 2**20:.1f} | {res['saved_activation_bytes'] / 2**20:.1f} | "
                         f"{choice} |")
            rows.append({"budget_gb": budget, "mode": mode, "step_s": res["median_step_s"],
                         "sub_models": len(swap["boundaries"]) - 1, "planned_peak": swap["planned_device_peak_bytes"],
                         "saved_activation_bytes": res["saved_activation_bytes"], "choice": choice})
    with open(a.out + ".json", "w") as f:
        json.dump({"budgets": budgets, "rounds": a.rounds, "rows": rows}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
