#!/usr/bin/env python3
"""Does training with compressed saved activations still learn? Validation loss of each
memory.activation_compression against none on the bundled corpus, same model, data and steps.

Usage: activation_compression_quality.py BUILD_DIR [--steps 2000] [--margin 0.01] [--config tiny_gpt]
                                         [--codecs none,none@2,bf16,fp8,int8] [--out bench/results] [--reuse]

Every codec runs `tessera train --config CONFIG` on one process (tiny_gpt: the `make train` model and
schedule; configs/tiny_llama.toml has the same schedule; train.steps = STEPS) with only
memory.activation_compression changed. A codec
written CODEC@SEED runs with train.seed = SEED instead: `none@2` is how far two uncompressed runs
that differ only in their initialisation and data order end apart, the scale against which the
codecs' differences are read. CODEC+CORE runs the attention core's saved tensors at CORE
(memory.attention_compression; `int4+int8`: int4 with the core at int8). adaptive:BITS chooses each
saved tensor's codec from its measured sensitivity within BITS an element (memory.activation_bits;
docs/memory.md, "Chosen per tensor"). The forward
is the same in every run; what the codec changes is the gradient (each block's backward reads the
decoded activations). Reported per codec: the final validation loss and its excess over none,
whether it is within --margin (relative), and the wall time. The loss curves go into one picture.
Results: OUT/activation_compression_quality_cpu.{md,json,svg} (another config's with _CONFIG before
_cpu); runs in runs/activation_compression/ (another config's in a folder of its name there)
(--reuse reads a run that already finished there, its last validation at STEPS, instead of training
again; its wall time is then not known).
"""
import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import plot_losses  # noqa: E402
from tessera_bench import bundled_corpus, compression_settings, unigram_baseline  # noqa: E402


def train_command(build, config, data, steps, run, out_dir):
    codecs, _, seed = run.partition("@")
    sets = {"data.path": data, "train.steps": steps, "checkpoint.every": 0, **compression_settings(codecs)}
    if seed:
        sets["train.seed"] = int(seed)
    cmd = [str(pathlib.Path(build) / "tessera"), "train", "--config", config, "--out", str(out_dir), "--overwrite"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def read_run(out_dir, run, cmd, wall_s):
    """A finished run's final losses, from its metrics.jsonl and the unigram baseline its log printed."""
    train_losses, val = plot_losses.read_metrics(out_dir / "metrics.jsonl")
    baseline = unigram_baseline((out_dir / "train.log").read_text().splitlines())
    return {"codec": run, "val_loss": val[-1][1], "final_train_loss": train_losses[-1][1], "wall_s": wall_s,
            "unigram": baseline, "command": " ".join(cmd)}


def train(build, config, data, steps, run, out_dir):
    cmd = train_command(build, config, data, steps, run, out_dir)
    start = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{run}: tessera train failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return read_run(out_dir, run, cmd, round(time.time() - start, 1))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--data", default=None, help="prepared corpus (default BUILD/data/kjv, as `make train` makes it)")
    a.add_argument("--steps", type=int, default=2000)
    a.add_argument("--margin", type=float, default=0.01)
    a.add_argument("--codecs", default="none,none@2,bf16,fp8,int8")
    a.add_argument("--config", default="tiny_gpt")
    a.add_argument("--reuse", action="store_true", help="read runs that finished before instead of training again")
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    data = bundled_corpus(args.build, args.data)
    codecs = args.codecs.split(",")
    if codecs[0] != "none":
        raise SystemExit("--codecs must start with none (the reference)")
    runs_root = pathlib.Path("runs/activation_compression")
    if args.config != "tiny_gpt":
        runs_root = runs_root / args.config
    results = []
    for codec in codecs:
        out_dir = runs_root / codec
        finished = args.reuse and (out_dir / "metrics.jsonl").exists() and \
            plot_losses.read_metrics(out_dir / "metrics.jsonl")[1][-1][0] == args.steps
        r = (read_run(out_dir, codec, train_command(args.build, args.config, data, args.steps, codec, out_dir), None)
             if finished else train(args.build, args.config, data, args.steps, codec, out_dir))
        results.append(r)
        print(f"[{codec}] val loss {r['val_loss']:.4f} (train {r['final_train_loss']:.4f}), {r['wall_s']} s", flush=True)
    # Each run against the uncompressed run of its own seed (none@SEED where it ran, else none).
    by_codec = {r["codec"]: r for r in results}
    for r in results:
        codec, _, seed = r["codec"].partition("@")
        reference = by_codec.get(f"none@{seed}" if seed and codec != "none" else "none", results[0])
        r["reference"] = reference["codec"]
        r["excess"] = r["val_loss"] / reference["val_loss"] - 1
        r["within_margin"] = abs(r["excess"]) <= args.margin

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("activation_compression_quality_cpu" if args.config == "tiny_gpt"
                  else f"activation_compression_quality_{args.config}_cpu")
    command = (f"python3 bench/activation_compression_quality.py {args.build}"
               f"{f' --config {args.config}' if args.config != 'tiny_gpt' else ''}"
               f"{f' --data {args.data}' if args.data else ''} --steps {args.steps} --codecs {args.codecs}"
               f"{' --reuse' if args.reuse else ''}")
    unigram = results[0]["unigram"]
    plot_losses.plot([(r["codec"], runs_root / r["codec"] / "metrics.jsonl") for r in results], f"{stem}.svg",
                     f"{args.config}: saved activations compressed against none", unigram)
    meta = {"command": command, "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "steps": args.steps, "margin": args.margin, "unigram": unigram}
    pathlib.Path(f"{stem}.json").write_text(json.dumps({**meta, "results": results}, indent=2) + "\n")
    lines = ["# Compressed saved activations: training quality on the bundled corpus (CPU, one process)", "",
             f"{args.config} (`make train`'s schedule), {args.steps} steps, batch 16 x 128 tokens; unigram "
             f"baseline {unigram} nats. Margin: final validation loss within {args.margin:.0%} of the uncompressed run "
             "of the same seed (none@2 against none: how far two seeds alone end apart). Wall times under --reuse are "
             "the earlier runs' and not kept.", "",
             "| run | against | final val loss | vs against | within margin | final train loss | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['codec']} | {r['reference']} | {r['val_loss']:.4f} | {r['excess']:+.2%} | "
                     f"{'yes' if r['within_margin'] else 'NO'} | {r['final_train_loss']:.4f} | {r['wall_s'] or '-'} |")
    lines += ["", f"![loss curves]({stem.name}.svg)", "", f"Command: `{command}`",
              f"Machine: {meta['machine']}, {meta['date']}"]
    pathlib.Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
