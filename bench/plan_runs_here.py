#!/usr/bin/env python3
"""tessera plan against runs on this machine: each layout predicted from this machine's calibrated
cluster file (`tessera plan calibrate`), then trained, its median step time measured.

The calibration is the only input the predictions take from this machine (matmul, memory and
kernel rates, core sharing, Gloo's loopback link); no step time of the runs below went into it.
Every layout trains the same model and global batch with train.threads = 1 per rank, 12 steps; the
median step of steps 4-12 is compared (the first steps warm up, and a pipeline rebuilds its table
for measured costs after step 2).

Peak memory: each run's metrics.jsonl peak_memory_gib (rank 0's peak resident set on the CPU)
against the plan's peak_memory_gib (the memory estimate of the largest rank) plus a fixed overhead
measured first: the peak of a run of a model too small to hold anything (1 block of width 8) less
its own estimate, what the process holds whatever it trains (libtorch, the data, the threads).

A dropless MoE layout under expert parallelism is planned with `--expert-load`, the busiest ep rank's
routed rows over an even share, read from the routing statistics (moe.load) of a one-process run
of the same layout (the same tokens through the same weights: its routing is the ep run's); that
run's step times are not used.

With --held-out N the same layouts train another model: 1, 8 blocks of width 192, 6 heads, a
vocabulary of 512, sequences of 96 (it guided this session's changes to the collectives' pricing,
so it is no longer held out: docs/plan.md); 2, 4 blocks of width 320, 8 heads, a vocabulary of 768,
sequences of 64, run once after them.

usage: bench/plan_runs_here.py [--tessera build/tessera] [--cluster F.toml (calibrates when absent)]
                               [--held-out 1|2] [--only TEXT] [--out bench/results/plan_runs_here_cpu.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=8", "model.vocab_size=256",
         "model.block_size=128", "train.seq_len=128", "train.global_batch_size=16", "train.threads=1",
         "train.steps=12", "train.log_every=1", "eval.every=0", "checkpoint.every=0", "optim.name=adamw",
         "train.tensorboard=false"]

# (name, world, layout keys)
LAYOUTS = [
    ("one process", 1, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8"]),
    ("one process, full checkpointing", 1, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0",
                                             "train.batch_size=8", "memory.activation_checkpointing=full"]),
    ("one process, selective checkpointing", 1, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0",
                                                  "train.batch_size=8", "memory.activation_checkpointing=selective"]),
    ("dp2 DDP", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8"]),
    ("dp2 ZeRO-1", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=1", "train.batch_size=8"]),
    ("dp2 ZeRO-2", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=2", "train.batch_size=8"]),
    ("dp2 ZeRO-3", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=3", "train.batch_size=8"]),
    ("dp2 micro-batch 2", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=2"]),
    ("tp2", 2, ["parallel.tp=2", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8"]),
    ("tp2 Megatron-SP", 2, ["parallel.tp=2", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                            "parallel.megatron_sp=true"]),
    ("pp2 1f1b", 2, ["parallel.tp=1", "parallel.pp=2", "parallel.zero_stage=0", "train.batch_size=2",
                     "parallel.pp_schedule=1f1b"]),
    ("pp2 gpipe", 2, ["parallel.tp=1", "parallel.pp=2", "parallel.zero_stage=0", "train.batch_size=2",
                      "parallel.pp_schedule=gpipe"]),
    ("pp2 zbh1", 2, ["parallel.tp=1", "parallel.pp=2", "parallel.zero_stage=0", "train.batch_size=2",
                     "parallel.pp_schedule=zbh1"]),
    ("pp2 zbv", 2, ["parallel.tp=1", "parallel.pp=2", "parallel.zero_stage=0", "train.batch_size=2",
                    "parallel.pp_schedule=zbv"]),
    ("pp2 interleaved", 2, ["parallel.tp=1", "parallel.pp=2", "parallel.zero_stage=0", "train.batch_size=2",
                            "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2"]),
    ("sp2 Ulysses", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                        "parallel.sp=2", "parallel.sp_method=ulysses"]),
    ("sp2 ring", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                     "parallel.sp=2", "parallel.sp_method=ring"]),
    ("sp2 LASP (linear attention)", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                                        "parallel.sp=2", "parallel.sp_method=lasp", "model.arch=linear"]),
    ("dp2 ZeRO-2 offload", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=2", "train.batch_size=8",
                               "parallel.offload=true"]),
    ("one process, swap (8 micro-batches)", 1, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0",
                                                 "train.batch_size=2", "memory.swap=true", "memory.device_budget_gb=0.04",
                                                 "memory.modelled_bandwidth_gbps=1"]),
    ("ep2 MoE, capacity 1.25", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                                   "model.ffn=moe", "model.moe_experts=4", "model.moe_top_k=2", "parallel.ep=2",
                                   "model.moe_capacity_factor=1.25"]),
    ("ep2 MoE, dropless", 2, ["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8",
                              "model.ffn=moe", "model.moe_experts=4", "model.moe_top_k=2", "parallel.ep=2",
                              "model.moe_capacity_factor=0"]),
]
# Dropless layouts are planned with `--expert-load`, the busiest ep rank's rows over an even share,
# read from the routing statistics (moe.load) of a one-process run of the same layout without ep:
# its step times are not used.

RUN_KEYS = ["train.global_batch_size=16", "train.threads=1", "train.steps=12", "train.log_every=1", "eval.every=0",
            "checkpoint.every=0", "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_MODELS = {
    "1": ["model.n_layer=8", "model.n_embd=192", "model.n_head=6", "model.vocab_size=512", "model.block_size=96",
          "train.seq_len=96"] + RUN_KEYS,
    "2": ["model.n_layer=4", "model.n_embd=320", "model.n_head=8", "model.vocab_size=768", "model.block_size=64",
          "train.seq_len=64"] + RUN_KEYS,
}


def run(args, check=True):
    out = subprocess.run(args, capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def sets(keys):
    out = []
    for k in keys:
        out += ["--set", k]
    return out


def full_layout(keys):
    given = {k.split("=")[0] for k in keys}
    defaults = {"parallel.megatron_sp": "false", "parallel.pp_schedule": "1f1b", "parallel.pp_virtual": "0",
                "memory.activation_checkpointing": "none", "parallel.sp": "1", "parallel.ep": "1",
                "parallel.offload": "false", "memory.swap": "false"}
    return keys + [f"{k}={v}" for k, v in defaults.items() if k not in given]


def expert_load(metrics, ep):
    """Mean over steps 4 on and layers of the busiest of `ep` ranks' rows (each holding a contiguous
    run of experts, as parallel/expert/ does) over an even share."""
    ratios = []
    for m in metrics:
        if m.get("step", 0) < 4 or "moe" not in m:
            continue
        for layer in m["moe"]:
            load = layer["load"]
            per_rank = len(load) // ep
            ranks = [sum(load[r * per_rank:(r + 1) * per_rank]) for r in range(ep)]
            ratios.append(max(ranks) / (sum(ranks) / ep))
    return statistics.mean(ratios)


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0] * len(x)
        for pos, i in enumerate(order):
            r[i] = pos
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default="build/tessera")
    parser.add_argument("--cluster", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--only", default="", help="the layouts whose name contains this text (a partial check: "
                        "write it with --out elsewhere)")
    parser.add_argument("--held-out", default="", choices=["", "1", "2"], help="train HELD_OUT_MODELS[N] instead of MODEL")
    a = parser.parse_args()
    model = HELD_OUT_MODELS[a.held_out] if a.held_out else MODEL
    out_file = a.out or ("bench/results/plan_runs_here_cpu.md" if not a.held_out else
                         f"bench/results/plan_runs_held_out{'' if a.held_out == '1' else '_' + a.held_out}_cpu.md")
    seq_len = int(next(k for k in model if k.startswith("train.seq_len=")).split("=")[1])
    work = tempfile.mkdtemp(prefix="plan_runs_here_")
    data = os.path.join(work, "data")
    run([a.tessera, "prepare", "--input", "data/kjv/genesis_to_ruth.txt", "--out", data])
    cluster = a.cluster or os.path.join(work, "this_machine.toml")
    if not a.cluster:
        run([a.tessera, "plan", "calibrate", "--out", cluster])
    def train(name, world, common):
        out = os.path.join(work, name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""))
        launch = [a.tessera, "train", "--config", "tiny_gpt", "--out", out, "--overwrite"] + common
        if world > 1:
            launch += ["--nproc", str(world)]
        run(launch)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    def plan(world, common, extra=()):
        return json.loads(run([a.tessera, "plan", "--config", "tiny_gpt", "--cluster", cluster, "--world", str(world),
                               "--json", "--top", "1"] + list(extra) + common))["layouts"][0]

    # The fixed overhead: a run of a model too small to hold anything, less its estimate.
    tiny = sets(model + [f"data.path={data}", "model.n_layer=1", "model.n_embd=8", "model.n_head=1"] +
                full_layout(["parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0", "train.batch_size=8"]))
    overhead = (max(m.get("peak_memory_gib", 0) for m in train("overhead", 1, tiny)) -
                plan(1, tiny)["peak_memory_gib"])
    print(f"fixed overhead: {overhead * 1024:.1f} MiB", flush=True)
    rows, predicted, measured, memory_errors = [], [], [], []
    loads = []
    for name, world, keys in [layout for layout in LAYOUTS if a.only in layout[0]]:
        keys = full_layout(keys)
        common = sets(model + [f"data.path={data}"] + keys)
        extra = []
        if "model.moe_capacity_factor=0" in keys and "parallel.ep=2" in keys:
            alone = sets(model + [f"data.path={data}"] + [k for k in keys if k != "parallel.ep=2"] + ["parallel.ep=1"])
            load = expert_load(train(name + " routing", 1, alone), 2)
            loads.append(f"{name}: {load:.3f}")
            print(f"{name}: --expert-load {load:.3f} (a one-process run's routing)", flush=True)
            extra = ["--expert-load", f"{load:.3f}"]
        layout = plan(world, common, extra)
        p = layout["step_s"]
        metrics = train(name, world, common)
        tokens_per_step = 16 * seq_len
        steps = [tokens_per_step / m["tokens_per_s"] for m in metrics if "tokens_per_s" in m and m["step"] >= 4]
        t = statistics.median(steps)
        memory = max(m.get("peak_memory_gib", 0) for m in metrics)
        memory_error = (layout["peak_memory_gib"] + overhead) / memory - 1
        predicted.append(p)
        measured.append(t)
        memory_errors.append(abs(memory_error))
        rows.append(f"| {name} | {world} | {1000 * p:.1f} | {1000 * t:.1f} | {100 * (p / t - 1):+.1f}% | "
                    f"{layout['peak_memory_gib'] * 1024:.1f} + {overhead * 1024:.0f} | {memory * 1024:.1f} | "
                    f"{100 * memory_error:+.1f}% |")
        print(rows[-1], flush=True)
    errors = [abs(p / t - 1) for p, t in zip(predicted, measured)]
    summary = (f"mean absolute error {100 * statistics.mean(errors):.1f}%, worst {100 * max(errors):.1f}%, "
               f"within 10%: {sum(e <= 0.10 for e in errors)} of {len(errors)}; Spearman rank correlation "
               f"{spearman(predicted, measured):.2f}; peak memory (estimate + the fixed overhead): mean absolute error "
               f"{100 * statistics.mean(memory_errors):.1f}%, within 5%: {sum(e <= 0.05 for e in memory_errors)} of "
               f"{len(memory_errors)}")
    print(summary)
    with open(out_file, "w") as f:
        f.write("# tessera plan against runs on this machine (2 cores, CPU, Gloo)\n\n"
                f"`python3 bench/plan_runs_here.py{' --held-out ' + a.held_out if a.held_out else ''}"
                f"{' --only ' + repr(a.only) if a.only else ''}` (its docstring says what is "
                "held and measured). Model keys: " + ", ".join(model) + "; global batch 16, AdamW, fp32.\n\n"
                "Cluster file:\n\n```\n" + open(cluster).read() + "```\n\n"
                f"Fixed overhead (a 1-block, width-8 run's peak less its estimate): {overhead * 1024:.1f} MiB.\n\n"
                + (f"Expert load (`--expert-load`, from a one-process run's routing): {'; '.join(loads)}.\n\n" if loads else "") +
                "| layout | ranks | predicted step ms | measured median ms | error | predicted peak MiB (estimate + "
                "overhead) | measured peak MiB | error |\n|---|---|---|---|---|---|---|---|\n")
        f.write("\n".join(rows) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
