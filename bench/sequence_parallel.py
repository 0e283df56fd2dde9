#!/usr/bin/env python3
"""Sequence parallelism, measured with `tessera bench --nproc`: bytes each rank sends per training
step against the sequence length, and the longest sequence that trains under a memory cap.

Usage: sequence_parallel.py BUILD_DIR [--ranks 4] [--lengths 4096,8192,16384,32768,65536]
                            [--cap-mib 256] [--degrees 1,2,4,8] [--out bench/results]

Bytes: tiny_linear (4 layers, width 128, 4 heads of 32) with LASP (ring) and LASP-2 on --ranks sp
ranks, batch 1, one timed step per length; the sp group's bytes sent by rank 0 (in the ring it sends
forward only) as `tessera bench` reports them, against the formulas
of docs/sequence_parallel.md and papers.md §2.3. Softmax methods (ulysses, ring) are measured on a
GPT of the same width; Megatron-SP is tiny_gpt at tp = --ranks with parallel.megatron_sp, its tp
group's bytes (the formula counts the blocks only; the measured total adds the embedding, the
head and the vocab-parallel loss).

Memory: for each sp degree, the longest sequence (a multiple of 1024 * degree) whose step keeps
rank 0's peak CPU tensor bytes (`peak_bytes`, the counting allocator) under --cap-mib, found by
bisection. Linear scaling would multiply the sp = 1 length by the degree; the floor is 0.9 of that.
Results: OUT/sequence_parallel_cpu.{md,json}.
"""
import argparse
import json
import pathlib
import platform
import time

from tessera_bench import tessera_bench

MODEL = {"model.n_layer": 4, "model.n_embd": 128, "model.n_head": 4, "train.batch_size": 1, "train.threads": 1,
         "data.path": "unused", "model.dropout": 0.0}


def bench(build, config, ranks, sets):
    return tessera_bench(build, config, {**MODEL, **sets}, ranks)


def predicted_bytes(method, length, ranks, rank, layers=4, width=128, heads=4, batch=1):
    """Bytes rank `rank` of `ranks` sends per step (forward + backward), float32."""
    head = width // heads
    state = batch * heads * head * head * 4
    chunk = length // ranks
    if method == "lasp":  # one state forward (to t+1) and one backward (to t-1) per layer
        return layers * state * ((rank + 1 < ranks) + (rank > 0))
    if method == "lasp2":  # two all-gathers of one state per layer
        return layers * 2 * (ranks - 1) * state
    if method == "ulysses":  # q, k, v, o forward and dO, dq, dk, dv backward: 8 all-to-alls of B C d
        return layers * 8 * (ranks - 1) * batch * chunk * width * 4 // ranks
    block = batch * chunk * width  # one chunk of K (or V) over all heads, elements
    if method == "ring":  # K, V blocks 0..t go on to t+1 (forward and again in backward), fp32 dK, dV travel W steps
        return layers * (4 * (rank + 1) * block * 4 * (rank + 1 < ranks) + 8 * ranks * block)
    if method == "megatron-sp":  # the blocks' 2 all-gathers + 2 reduce-scatters of B N d forward, as many
        # backward, and 2 more all-gathers of the column products' kept inputs for their weight gradients
        # (tp_comm.h, sequence_gathered_linear); measured totals add the embedding, the head's gathers and
        # the vocab-parallel loss
        return layers * 10 * (ranks - 1) * batch * chunk * width * 4
    raise ValueError(method)


def longest_sequence(build, degree, cap_bytes, method):
    step = 1024 * degree

    def fits(length):
        peak = bench(build, "tiny_linear", degree, {"parallel.sp": degree, "parallel.sp_method": method,
                                                    "train.seq_len": length, "model.block_size": length})["peak_bytes"]
        print(f"  sp={degree} T={length}: peak {peak / 2**20:.1f} MiB", flush=True)
        return peak <= cap_bytes

    low, high = 0, 4 * step
    while fits(high):  # grow until a length no longer fits, then bisect
        low, high = high, 2 * high
    while high - low > step:
        middle = (low + high) // 2 // step * step
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--ranks", type=int, default=4)
    a.add_argument("--lengths", default="4096,8192,16384,32768,65536")
    a.add_argument("--methods", default="lasp,lasp2,ulysses,ring,megatron-sp")
    a.add_argument("--softmax-max-length", type=int, default=16384,
                   help="softmax attention is quadratic: longer sequences get the formula only")
    a.add_argument("--cap-mib", type=float, default=512)
    a.add_argument("--degrees", default="1,2,4,8", help="sp degrees for the memory search ('' to skip it)")
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = args.methods.split(",")

    rows = []
    for length in lengths:
        row = {"length": length}
        for method in methods:
            config = "tiny_linear" if method.startswith("lasp") else "tiny_gpt"
            if config == "tiny_gpt" and length > args.softmax_max_length:
                continue
            if method == "megatron-sp":  # tp = ranks with Megatron sequence parallelism: the tp group's bytes
                r = bench(args.build, config, args.ranks, {"parallel.tp": args.ranks, "parallel.megatron_sp": "true",
                                                             "train.seq_len": length, "model.block_size": length})
                row[method] = sum(r["tp_bytes_per_step"].values())
            else:
                r = bench(args.build, config, args.ranks, {"parallel.sp": args.ranks, "parallel.sp_method": method,
                                                             "train.seq_len": length, "model.block_size": length})
                # The sp group is also the gradients' group here (dp = 1): leave out its all_reduce.
                row[method] = sum(b for op, b in r["sp_bytes_per_step"].items() if op != "all_reduce")
            row[method + "_tokens_per_s"] = r["tokens_per_s"]
            print(f"T={length} {method}: {row[method]:.0f} bytes/step, "
                  f"predicted {predicted_bytes(method, length, args.ranks, 0)}", flush=True)
        rows.append(row)

    cap = int(args.cap_mib * 2**20)
    memory = []
    for degree in [int(x) for x in args.degrees.split(",") if x]:
        longest = longest_sequence(args.build, degree, cap, "lasp")
        memory.append({"sp": degree, "longest": longest})
    base = memory[0]["longest"] if memory else None
    for m in memory:
        m["vs_linear"] = m["longest"] / (base * m["sp"]) if base else None

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = (f"python3 bench/sequence_parallel.py {args.build} --ranks {args.ranks} --lengths {args.lengths} "
               f"--methods {args.methods} --softmax-max-length {args.softmax_max_length} --cap-mib {args.cap_mib:g} "
               f"--degrees {args.degrees}")
    meta = {"command": command, "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M")}
    pathlib.Path(out / "sequence_parallel_cpu.json").write_text(
        json.dumps({**meta, "bytes": rows, "memory": memory}, indent=2) + "\n")
    all_methods = methods + [m for m in ("ulysses", "ring", "megatron-sp") if m not in methods]
    lines = [f"# Sequence parallelism on {args.ranks} ranks (CPU, fp32)", "",
             "Bytes rank 0 sends per training step (forward + backward), tiny_linear / tiny_gpt shapes "
             "(4 layers, width 128, 4 heads), batch 1. Measured where the method is built, else the formula "
             "(marked f).", "",
             "| T | " + " | ".join(all_methods) + " |", "|---|" + "---|" * len(all_methods)]
    for row in rows:
        cells = []
        for m in all_methods:
            predicted = predicted_bytes(m, row["length"], args.ranks, 0)
            if m in row:
                cells.append(f"{row[m] / 1024:.0f} KiB (formula {predicted / 1024:.0f})")
            else:
                cells.append(f"{predicted / 1024:.0f} KiB f")
        lines.append(f"| {row['length']} | " + " | ".join(cells) + " |")
    lines += ["", "Training throughput in the same runs (tokens/s over all ranks, one step after one warm-up; "
              f"{args.ranks} processes on this machine's cores, so compare methods, not absolute values):", "",
              "| T | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for row in rows:
        lines.append(f"| {row['length']} | " + " | ".join(
            f"{row[m + '_tokens_per_s']:.0f}" if m + "_tokens_per_s" in row else "-" for m in methods) + " |")
    lines += ["", f"Longest trainable sequence (LASP) with rank 0's peak CPU tensor bytes under {args.cap_mib:g} MiB:",
              "", "| sp | longest T | vs sp=1 x sp (floor 0.9) |", "|---|---|---|"]
    for m in memory:
        lines.append(f"| {m['sp']} | {m['longest']} | {m['vs_linear']:.2f} |")
    lines += ["", f"Command: `{command}`", f"Machine: {meta['machine']}, {meta['date']}"]
    pathlib.Path(out / "sequence_parallel_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
