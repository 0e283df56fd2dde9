#!/usr/bin/env python3
"""A pipeline rank's held micro-batches in host memory (memory.resident_micro_batches; issue 53).

Two ranks, one intra-op thread each, float32 tiny_gpt with N_LAYER blocks, train.batch_size BATCH
and ACCUM micro-batches a step, for each SCHEDULE (1f1b, interleaved). Policies:
  resident             every micro-batch's activations on the device;
  offload every block  memory.activation_offload = n_layer: every block of every micro-batch
                       waits in host memory, whatever the schedule holds;
  resident R           memory.resident_micro_batches = R: rank 0 keeps R micro-batches (of a stage
                       each) on the device and offloads every block of the ones held beyond them;
  full recomputation   memory.activation_checkpointing = full.
The CPU "device"'s link is modelled at RATE GB/s each way (memory.modelled_bandwidth_gbps). Each
round runs every policy once (`tessera bench --json`, rank 0's figures); ROUNDS rounds. Reported:
  step ms          the median over rounds of each round's median step;
  step / resident  the median over rounds of the step over the same round's resident step;
  device MiB       saved_activation_bytes on rank 0 (the rank that holds the most);
  host MiB         saved_activation_host_bytes on rank 0;
  stored MiB       the bytes rank 0 copied to the host per step;
  waited ms        per step, the time rank 0's unpacks waited for fetches.
Written to bench/results/pipeline_held_offload_cpu.md.

usage: bench/pipeline_held_offload.py BUILD_DIR [--rounds 3] [--steps 5] [--batch 8] [--accum 8]
                                      [--layers 8] [--rate 16] [--resident 1,2]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from tessera_bench import tessera_bench  # noqa: E402

MIB = 1024 * 1024


def policies(layers, resident):
    out = [("resident", {}), ("offload every block", {"memory.activation_offload": layers})]
    out += [(f"resident {r}", {"memory.resident_micro_batches": r}) for r in resident]
    out.append(("full recomputation", {"memory.activation_checkpointing": "full"}))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rate", type=float, default=16)
    ap.add_argument("--resident", default="1,2")
    args = ap.parse_args()
    resident = [int(r) for r in args.resident.split(",")]
    lines = ["# A pipeline rank's held micro-batches in host memory (CPU)", "",
             f"`python3 bench/pipeline_held_offload.py {args.build} --rounds {args.rounds} --steps {args.steps} "
             f"--batch {args.batch} --accum {args.accum} --layers {args.layers} --rate {args.rate:g} "
             f"--resident {args.resident}`: tiny_gpt with {args.layers} blocks, pp 2, one thread per rank, "
             f"{args.accum} micro-batches of {args.batch} x 128 tokens, float32, link modelled at {args.rate:g} GB/s; "
             "rank 0's figures.", ""]
    for schedule in ("1f1b", "interleaved"):
        base = {"parallel.pp": 2, "parallel.pp_schedule": schedule, "model.n_layer": args.layers,
                "train.batch_size": args.batch, "train.seq_len": 128, "train.grad_accum": args.accum,
                "train.threads": 1, "memory.modelled_bandwidth_gbps": args.rate}
        runs = {name: [] for name, _ in policies(args.layers, resident)}
        for round_ in range(args.rounds):
            for name, sets in policies(args.layers, resident):
                j = tessera_bench(args.build, "tiny_gpt", {**base, **sets}, ranks=2, steps=args.steps, warmup=1)
                runs[name].append(j)
                print(f"{schedule} round {round_ + 1}: {name}: {1e3 * j['median_step_s']:.1f} ms, "
                      f"{j['saved_activation_bytes'] / MIB:.2f} MiB", file=sys.stderr)
        lines += [f"## {schedule}", "",
                  "| policy | step ms | step / resident | device MiB | host MiB | stored MiB | waited ms |",
                  "|---|---|---|---|---|---|---|"]
        for name, js in runs.items():
            ratio = statistics.median(j["median_step_s"] / r["median_step_s"] for j, r in zip(js, runs["resident"]))
            last = js[-1]
            off = last.get("activation_offload", {})
            host = last.get("saved_activation_host_bytes")
            lines.append(f"| {name} | {1e3 * statistics.median(j['median_step_s'] for j in js):.1f} | {ratio:.3f} | "
                         f"{last['saved_activation_bytes'] / MIB:.2f} | "
                         f"{host / MIB if host is not None else 0:.2f} | "
                         f"{off.get('stored_bytes_per_step', 0) / MIB:.1f} | "
                         f"{1e3 * off.get('fetch_wait_s_per_step', 0):.2f} |")
        lines.append("")
    write_results(str(Path(__file__).resolve().parent / "results" / "pipeline_held_offload_cpu.md"), lines)


if __name__ == "__main__":
    main()
