#!/usr/bin/env python3
"""The activation policy for a budget against what its runs measure (issue 53).

One process, float32, CONFIG (default tiny_gpt, batch 16); with --pp P, P pipeline ranks (--schedule, 1F1B by default,
2P micro-batches) and rank 0's policy, bytes and step. For each activation share (MiB of the
budget left after the model's state) and each modelled link (GB/s), `memory.activation_policy =
auto` chooses each block's option from the start-up profile, with each allowance of --compressions
in turn (memory.activation_compression: none, no block encodes; a codec; or a comma-separated list
of codecs each block chooses from); the run is timed against the
resident run of the same round (ROUNDS rounds, each policy after its resident run). Reported:
  choices          the blocks' options, in order;
  predicted MiB    the policy's device bytes (with the reserves) against the share;
  measured MiB     saved_activation_bytes: what autograd held for the blocks at the step's peak (a
                   recomputed block's activations are made outside the count);
  predicted ms     the seconds the policy adds to a step;
  measured ms      the median over rounds of the step less the same round's resident step.
The profile sets the prediction's F and B; the timed steps check it.
Written to bench/results/activation_policy_cpu.md.

usage: bench/activation_policy.py BUILD_DIR [--rounds 3] [--steps 5] [--shares 48,32,20] [--links 16,0.05]
                                  [--compressions none int8 bf16,int8] [--pp 1] [--schedule 1f1b]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from tessera_bench import device_model_state, tessera_bench  # noqa: E402

MIB = 1024 * 1024
GIB = 1024 * MIB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--config", default="tiny_gpt")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--shares", default="48,32,20")
    ap.add_argument("--links", default="16,0.05")
    ap.add_argument("--compressions", nargs="+", default=["none"])
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or ("bench/results/activation_policy_cpu.md" if args.pp == 1
                       else f"bench/results/activation_policy_pp{args.pp}"
                            f"{'' if args.schedule == '1f1b' else '_' + args.schedule}_cpu.md")
    setup = ("one process" if args.pp == 1 else
             f"{args.pp} pipeline ranks of one thread each ({args.schedule}, {2 * args.pp} micro-batches; rank 0's policy, bytes and step; the "
             "predicted ms are rank 0's added seconds, which the pipeline may hide or pass on)")
    base = {"train.batch_size": args.batch}
    if args.pp > 1:
        # One intra-op thread per rank: two ranks of two threads each on two cores stall each other.
        base.update({"parallel.pp": args.pp, "parallel.pp_schedule": args.schedule, "train.grad_accum": 2 * args.pp,
                     "train.threads": 1})
    ranks = args.pp
    # The model's state on the device: the budget's part that activations do not get.
    state = device_model_state(args.build, args.config, base, ranks=ranks)
    cases = [(float(share), float(link), codec) for link in args.links.split(",") for share in args.shares.split(",")
             for codec in args.compressions]
    resident, runs = [], {case: [] for case in cases}
    for r in range(args.rounds):
        for case in cases:
            share, link, codec = case
            resident.append(tessera_bench(args.build, args.config, {**base, "memory.modelled_bandwidth_gbps": link},
                                          ranks=ranks, steps=args.steps))
            sets = {**base, "memory.activation_policy": "auto", "memory.device_budget_gb": (state + share * MIB) / GIB,
                    "memory.modelled_bandwidth_gbps": link, "memory.activation_compression": codec}
            result = tessera_bench(args.build, args.config, sets, ranks=ranks, steps=args.steps)
            result["resident_step_s"] = resident[-1]["median_step_s"]
            runs[case].append(result)
            print(f"round {r + 1}: share {share:g} MiB, link {link:g} GB/s, codec {codec}: "
                  f"{' '.join(b['option'] for b in result['activation_policy']['blocks'])}", flush=True)
    keep = statistics.median(x["saved_activation_bytes"] for x in resident) / MIB
    lines = [f"# The activation policy for a budget against its runs ({args.config}, CPU)", "",
             f"`python3 bench/activation_policy.py {args.build} --rounds {args.rounds} --steps {args.steps} "
             f"--shares {args.shares} --links {args.links} --compressions {' '.join(args.compressions)} --pp {args.pp} --schedule {args.schedule}`: {setup}, "
             f"float32, batch {args.batch}; each policy "
             f"run after a resident run in each of {args.rounds} rounds. The resident run held {keep:.1f} MiB for "
             "the blocks. Share: the budget left for activations after the model's state.", "",
             "| share MiB | link GB/s | codec allowed | choices | predicted MiB | measured MiB | predicted ms | "
             "measured ms |",
             "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        share, link, codec = case
        results = runs[case]
        policy = results[-1]["activation_policy"]
        measured_ms = 1e3 * statistics.median(x["median_step_s"] - x["resident_step_s"] for x in results)
        peak = statistics.median(x["saved_activation_bytes"] for x in results) / MIB
        predicted_ms = 1e3 * statistics.median(x["activation_policy"]["predicted_added_s_per_step"] for x in results)
        lines.append(f"| {share:g} | {link:g} | {codec} | {', '.join(b['option'] for b in policy['blocks'])} | {policy['bytes'] / MIB:.1f} | "
                     f"{peak:.1f} | {predicted_ms:.1f} | {measured_ms:.1f} |")
    write_results(out, lines)


if __name__ == "__main__":
    main()
