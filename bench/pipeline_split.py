#!/usr/bin/env python3
"""Pipeline schedules at pp 2, one process per core, measured: what the zero-bubble split costs, how
each schedule's step compares with 1F1B's and with PyTorch's own torch.distributed.pipelining, and how
close the simulator fed with the measured action times comes to the measured bubble.

1. F, I and W per action (`tessera bench` pp_action_ms, ZB-H1) and B (1F1B) on tiny_gpt widened to 8
   blocks of 128 and on GPT-2 124M's shapes (12 blocks of 768, vocabulary 50257, 256 tokens per
   micro-batch): W against I, and I + W against B.
2. Every schedule at pp 2 with 8 and 16 micro-batches of 4 x 128 tokens (tiny_gpt widened), ROUNDS
   rounds, the runs of one round interleaved (this build, the baseline build if given, the PyTorch
   twin bench/pytorch_pipeline_twin.py where PyTorch has the schedule); each keeps its best median
   step. Per tessera row (`tessera bench` pp_bubble and pp_transfer_ms, over its timed steps): the
   measured bubble, the bubble the simulator gives from each stage's mean F, B, I, W, each rank's
   optimizer step and the measured host costs of the transfers (posting a send, posting a receive,
   a transfer's time), and the replay (each step simulated with its own actions' durations).
3. Bytes each rank sends to the other per step (pp_bytes_per_step) at float32 and under bf16 with
   parallel.pp_transfer_dtype = compute, against m x batch x seq x n_embd x the dtype's bytes.
Written to bench/results/pipeline_split_cpu.{md,json}; --parts runs some parts again, keeping the
others' results from the JSON.

usage: bench/pipeline_split.py BUILD_DIR [--baseline OLD_BUILD_DIR] [--rounds 3] [--no-pytorch] [--no-gpt2]
                               [--parts fiw,schedules,bytes] [--schedules zbv,1f1b]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tessera_bench import tessera_bench  # noqa: E402

TINY = {"model.n_layer": 8, "model.n_embd": 128, "model.n_head": 4, "model.block_size": 128,
        "train.seq_len": 128, "train.batch_size": 4, "train.threads": 1}
GPT2 = {"train.seq_len": 256, "train.batch_size": 1, "train.threads": 1}
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev"]
# tessera's schedule -> the PyTorch twin's (bench/pytorch_pipeline_twin.py); ZB-H1 has none, and
# PyTorch's interleaved zero-bubble has no tessera table: it is run beside ZB-H1 and ZB-V.
TWIN = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved": "interleaved", "zbv": "zbv", "dualpipev": "dualpipev",
        "zbh1": "izb"}


def tessera(build, config, sets, m, schedule, steps=5, warmup=2):
    s = dict(sets, **{"parallel.pp": 2, "parallel.pp_schedule": schedule, "train.grad_accum": m})
    return tessera_bench(build, config, s, ranks=2, steps=steps, warmup=warmup,
                         flags=("--out", "/tmp/tessera-pipeline-split"))


def pytorch(schedule, m):
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "pytorch_pipeline_twin.py"), "--schedule", schedule,
           "--microbatches", str(m)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"error": (out.stderr or out.stdout)[-300:]}
    return json.loads(lines[-1])


def actions(build, gpt2):
    rows = []
    cases = [("tiny_gpt, 8 x 128", "tiny_gpt", TINY, 8)]
    if gpt2:
        cases.append(("GPT-2 124M shapes", "gpt2_124m", GPT2, 4))
    for name, config, sets, m in cases:
        zb = tessera(build, config, sets, m, "zbh1", steps=2, warmup=1)
        ofob = tessera(build, config, sets, m, "1f1b", steps=2, warmup=1)
        a, b = zb["pp_action_ms"], ofob["pp_action_ms"]
        rows.append({"model": name, "F": a["F"], "I": a["I"], "W": a["W"], "B": b["B"], "W_over_I": a["W"] / a["I"],
                     "IW_over_B": (a["I"] + a["W"]) / b["B"]})
        print(rows[-1], flush=True)
    return rows


def wire_bytes(build):
    rows = []
    m, batch, seq, width = 8, TINY["train.batch_size"], TINY["train.seq_len"], TINY["model.n_embd"]
    for dtype, sets in [("float32", {}), ("bf16 (compute)", {"precision.dtype": "bf16"}),
                        ("bf16, pp_transfer_dtype = float32", {"precision.dtype": "bf16",
                                                               "parallel.pp_transfer_dtype": "float32"})]:
        got = tessera(build, "tiny_gpt", dict(TINY, **sets), m, "1f1b", steps=2, warmup=1)
        size = 2 if dtype.startswith("bf16 (") else 4
        rows.append({"dtype": dtype, "sent": got["pp_bytes_per_step"]["send"], "formula": m * batch * seq * width * size,
                     "step_s": got["median_step_s"]})
        print(rows[-1], flush=True)
    return rows


def schedules(build, baseline, rounds, with_pytorch, names):
    best = {}  # (peer, schedule, m) -> best run
    for r in range(rounds):
        for m in (8, 16):
            for schedule in names:
                runs = [("tessera", lambda: tessera(build, "tiny_gpt", TINY, m, schedule))]
                if baseline:
                    runs.append(("baseline", lambda: tessera(baseline, "tiny_gpt", TINY, m, schedule)))
                if with_pytorch and m == 8 and schedule in TWIN:
                    runs.append(("pytorch", lambda: pytorch(TWIN[schedule], m)))
                for peer, run in runs:
                    got = run()
                    key = (peer, schedule, m)
                    if "error" in got:
                        best[key] = got
                    elif key not in best or got["median_step_s"] < best[key]["median_step_s"]:
                        best[key] = got
                    print(r, peer, schedule, m, got.get("median_step_s", got.get("error")), flush=True)
    return best


def write(build, results):
    settings = results.get("settings", {})  # the schedules part's run
    baseline, rounds, no_pytorch = settings.get("baseline"), settings.get("rounds"), not settings.get("pytorch", True)
    fiw, wire = results.get("fiw", []), results.get("bytes", [])
    best = {(r["peer"], r["schedule"], r["microbatches"]): r for r in results.get("runs", [])}
    out = Path("bench/results/pipeline_split_cpu.md")
    lines = ["# Pipeline schedules at pp 2: the zero-bubble split, 1F1B, and PyTorch's pipelining (CPU)", "",
             f"Command: `python3 bench/pipeline_split.py {build}" + (f" --baseline {baseline}" if baseline else "")
             + f" --rounds {rounds}`. Two processes, one per core, one intra-op thread each (Gloo on loopback). "
             f"Best median step of {rounds} rounds, runs interleaved within a round.", ""]
    if fiw:
        lines += ["## F, I and W per action (mean over both ranks and the timed steps)", "",
                  "| model | F ms | I ms | W ms | W / I | B ms (1F1B) | (I + W) / B |", "|---|---|---|---|---|---|---|"]
        for r in fiw:
            lines.append(f"| {r['model']} | {r['F']:.2f} | {r['I']:.2f} | {r['W']:.2f} | {r['W_over_I']:.2f} | "
                         f"{r['B']:.2f} | {r['IW_over_B']:.2f} |")
        lines.append("")
    if wire:
        lines += ["## Bytes rank 0 sends per step (1F1B, 8 micro-batches of 4 x 128 x 128)", "",
                  "| precision, wire | bytes sent | formula m x b x s x h x dtype | step s |", "|---|---|---|---|"]
        for r in wire:
            lines.append(f"| {r['dtype']} | {r['sent']:.0f} | {r['formula']:.0f} | {r['step_s']:.3f} |")
        lines.append("")
    for m in (8, 16):
        base = best.get(("tessera", "1f1b", m), {}).get("median_step_s")
        lines += [f"## {m} micro-batches of 4 x 128 tokens (tiny_gpt widened to 8 blocks of 128)", ""]
        head = ("| schedule | tessera step s | vs tessera 1F1B | bubble measured | bubble simulated | bubble replayed | "
                "send / post / transfer ms |")
        sep = "|---|---|---|---|---|---|---|"
        if baseline:
            head += " baseline step s | this / baseline |"
            sep += "---|---|"
        if m == 8 and not no_pytorch:
            head += " PyTorch schedule | PyTorch step s | PyTorch / tessera |"
            sep += "---|---|---|"
        lines += [head, sep]
        for schedule in SCHEDULES:
            t = best.get(("tessera", schedule, m))
            if not t:
                continue
            bubble, host = t["pp_bubble"], t["pp_transfer_ms"]
            row = (f"| {schedule} | {t['median_step_s']:.3f} | {base / t['median_step_s']:.2f}x | "
                   f"{100 * bubble['measured']:.1f}% | {100 * bubble['simulated']:.1f}% | "
                   f"{100 * bubble['replayed']:.1f}% | {host['send']:.2f} / {host['post']:.2f} / {host['transfer']:.2f} |")
            if baseline:
                b = best.get(("baseline", schedule, m), {})
                bs = b.get("median_step_s")
                row += f" {bs:.3f} | {t['median_step_s'] / bs:.3f} |" if bs else " - | - |"
            if m == 8 and not no_pytorch:
                p = best.get(("pytorch", schedule, m))
                if schedule not in TWIN or not p:
                    row += " - | - | - |"
                elif "error" in p:
                    row += f" {p.get('pytorch_class', TWIN[schedule])} | fails: {p['error'][:80]} | - |"
                else:
                    row += (f" {p['pytorch_class']} | {p['median_step_s']:.3f} | "
                            f"{p['median_step_s'] / t['median_step_s']:.2f} |")
            lines.append(row)
        lines.append("")
    out.write_text("\n".join(lines) + "\n")
    print("wrote", out)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--baseline")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--no-pytorch", action="store_true")
    a.add_argument("--no-gpt2", action="store_true")
    a.add_argument("--parts", default="fiw,schedules,bytes")
    a.add_argument("--schedules", help="only these (comma-separated), keeping the other rows")
    args = a.parse_args()
    store = Path("bench/results/pipeline_split_cpu.json")
    results = json.loads(store.read_text()) if store.exists() else {}
    parts = args.parts.split(",")
    if "fiw" in parts:
        results["fiw"] = actions(args.build, not args.no_gpt2)
    if "bytes" in parts:
        results["bytes"] = wire_bytes(args.build)
    if "schedules" in parts:
        names = args.schedules.split(",") if args.schedules else SCHEDULES
        best = schedules(args.build, args.baseline, args.rounds, not args.no_pytorch, names)
        if args.schedules:  # these schedules' runs again; the others' (and their other peers') kept
            kept = [r for r in results.get("runs", []) if (r["peer"], r["schedule"], r["microbatches"]) not in best]
        else:
            kept = []
            results["settings"] = {"baseline": args.baseline, "rounds": args.rounds, "pytorch": not args.no_pytorch}
        results["runs"] = kept + [{**v, "peer": k[0], "schedule": k[1], "microbatches": k[2]} for k, v in best.items()]
    store.write_text(json.dumps(results, indent=1) + "\n")
    write(args.build, results)


if __name__ == "__main__":
    main()
