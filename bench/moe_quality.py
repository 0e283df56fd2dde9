#!/usr/bin/env python3
"""Training quality of a mixture of experts on the bundled corpus, by load-balancing method.

Usage: moe_quality.py BUILD_DIR [--steps 600] [--out bench/results]

configs/tiny_moe.toml's shape with 8 experts, top-2, every block MoE, trained `--steps` steps on the
bundled corpus (build/data/kjv) four ways, one after the other, against the dense model of the
same active compute (mlp_ratio 8 = top_k x 4):
  aux loss        the Switch load-balancing loss (model.moe_aux_loss_coef = 0.01);
  aux-loss-free   no aux loss, the DeepSeek-V3 selection bias (model.moe_bias_update_rate = 0.001);
  none            neither;
  dense           model.ffn = dense, model.mlp_ratio = 8.
Reported: the final validation loss, the last step's MaxVio averaged over the MoE layers and its
worst layer, the dropped fraction, tokens/s; each MoE run's heat map (scripts/plot_expert_load.py)
and the loss curves beside the table. Results: OUT/moe_quality_cpu.md, .svg files.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
import plot_expert_load  # noqa: E402
import plot_losses  # noqa: E402

COMMON = ["--set", "model.moe_experts=8", "--set", "model.moe_top_k=2", "--set", "model.moe_every=1",
          "--set", "eval.every=100"]
RUNS = {
    "aux loss": ["--set", "model.moe_aux_loss_coef=0.01"],
    "aux-loss-free": ["--set", "model.moe_aux_loss_coef=0", "--set", "model.moe_bias_update_rate=0.001"],
    "none": ["--set", "model.moe_aux_loss_coef=0"],
    "dense": ["--set", "model.ffn=dense", "--set", "model.mlp_ratio=8"],
}


def metrics(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]


def main():
    a = argparse.ArgumentParser()
    a.add_argument("build")
    a.add_argument("--steps", type=int, default=600)
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], []
    for name, sets in RUNS.items():
        run_dir = pathlib.Path("runs") / ("moe_quality_" + name.replace(" ", "_").replace("-", "_"))
        cmd = [str(pathlib.Path(args.build) / "tessera"), "train", "--config", "configs/tiny_moe.toml",
               "--set", f"data.path={args.build}/data/kjv", "--set", f"train.steps={args.steps}", *COMMON, *sets,
               "--out", str(run_dir), "--overwrite"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        lines = metrics(run_dir)
        val = [l["val_loss"] for l in lines if "val_loss" in l][-1]
        speed = [l["tokens_per_s"] for l in lines if "tokens_per_s" in l]
        row = {"run": name, "val_loss": val, "tokens_per_s": sum(speed) / len(speed)}
        last = [l for l in lines if "moe" in l]
        if last:
            layers = last[-1]["moe"]
            row.update(max_violation=sum(m["max_violation"] for m in layers) / len(layers),
                       worst_max_violation=max(m["max_violation"] for m in layers),
                       dropped=sum(m["dropped"] for m in layers) / len(layers))
            svg = out / f"moe_quality_load_{run_dir.name[len('moe_quality_'):]}.svg"
            plot_expert_load.plot(run_dir, svg, f"expert load: {name} ({args.steps} steps)")
            row["heat_map"] = svg.name
        rows.append(row)
        curves.append((name, run_dir / "metrics.jsonl"))
        print(row, flush=True)
    plot_losses.plot(curves, out / "moe_quality_loss.svg", f"tiny_moe shape, 8 experts top-2: {args.steps} steps", None)
    md = [f"# MoE training quality by load-balancing method (CPU, {time.strftime('%Y-%m-%d')})", "",
          f"`python3 bench/moe_quality.py build --steps {args.steps}`: configs/tiny_moe.toml with 8 experts, top-2, "
          "every block MoE (capacity factor 1.25), on the bundled corpus; dense = the same active compute "
          "(mlp_ratio 8). MaxVio = max load / mean load - 1 at the last logged step, mean over layers (worst layer).",
          "", "| run | val loss | MaxVio mean (worst) | dropped | tokens/s | heat map |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "max_violation" in r:
            moe = f"{r['max_violation']:.3f} ({r['worst_max_violation']:.3f}) | {r['dropped']:.3f}"
            heat = f"[{r['heat_map']}]({r['heat_map']})"
        else:
            moe, heat = "- | -", "-"
        md.append(f"| {r['run']} | {r['val_loss']:.4f} | {moe} | {r['tokens_per_s']:.0f} | {heat} |")
    md += ["", "Loss curves: [moe_quality_loss.svg](moe_quality_loss.svg)."]
    (out / "moe_quality_cpu.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
