#!/usr/bin/env python3
"""Which saved activations move the gradients most when rounded: GACT's per-tensor sensitivity,
measured on PyTorch's twin of tessera's blocks (bench/pytorch_twin.py: the same GPT and Llama
blocks), the reason memory.attention_compression exists (docs/memory.md).

The twin trains --steps steps on the bundled corpus (AdamW, the `make train` model's shape and
rates), so the activations are a trained model's. Then, on --batches fixed batches, each tensor a
block saves for its backward (autograd's saved-tensor hooks, sorted as tessera sorts them:
parameters, tensors off the gradient's path and tensors whose last dimension is not adjacent are
kept) is rounded alone, in every block at once, to int4 and then to int8 (tessera's encodings: a
float32 scale per 32 elements of the last dimension, codes to 7 or 127), the others kept exact; its
sensitivity is the gradient's relative error, |g - g_exact| / |g_exact| over all parameters,
averaged over the batches. A tensor is in the attention core when scaled-dot-product attention
saves it (tessera's core also holds the rotary step, which saves only its tables). Then the whole
block: every tensor at int8, every one at int4, and int4 with the core's at int8, each with its
bits per element (codes and scales).

Usage: activation_sensitivity.py [--families gpt,llama] [--steps 300] [--batches 4] [--out bench/results]
Results: OUT/activation_sensitivity_cpu.md and .json.
"""
import argparse
import json
import pathlib
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from pytorch_twin import GPT, Llama  # noqa: E402

GROUP = 32
BATCH, SEQ = 16, 128
CORPUS = pathlib.Path(__file__).resolve().parent.parent / "build" / "data" / "kjv" / "train.bin"


def rounded(x, top):
    """x through tessera's int8 (top 127) or int4 (top 7) encoding and back."""
    rows = x.reshape(-1, x.shape[-1]).float()
    pad = (-rows.shape[1]) % GROUP
    groups = F.pad(rows, (0, pad)).view(-1, GROUP)
    amax = groups.abs().amax(1, keepdim=True)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    back = (torch.round(groups / scale).clamp(-top, top) * scale).view(rows.shape[0], -1)[:, :x.shape[-1]]
    return back.reshape(x.shape).to(x.dtype)


class Rounding:
    """Saved-tensor hooks that round the tensors `rule(slot, in_core)` names (None: kept exact), and
    record each encodable tensor's slot (its place in the block's saving order), shape and core."""

    def __init__(self, weights, rule):
        self.weights, self.rule = weights, rule
        self.slot, self.in_core, self.seen = 0, False, []

    def pack(self, t):
        if (not t.is_floating_point() or not t.requires_grad or t.dim() == 0 or t.stride(-1) != 1
                or t.untyped_storage().data_ptr() in self.weights):
            return t
        slot = self.slot
        self.slot += 1
        self.seen.append((slot, tuple(t.shape), t.numel(), self.in_core))
        top = self.rule(slot, self.in_core)
        return rounded(t.detach(), top) if top else t

    def unpack(self, t):
        return t


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--families", default="gpt,llama")
    a.add_argument("--steps", type=int, default=300)
    a.add_argument("--batches", type=int, default=4)
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    torch.set_num_threads(2)
    tokens = torch.from_numpy(np.frombuffer(CORPUS.read_bytes()[1024:], dtype=np.uint16).astype(np.int64))

    def batch(g):
        ix = torch.randint(len(tokens) - SEQ - 1, (BATCH,), generator=g)
        return (torch.stack([tokens[i:i + SEQ] for i in ix]), torch.stack([tokens[i + 1:i + SEQ + 1] for i in ix]))

    report = {"command": "python3 bench/activation_sensitivity.py " + " ".join(sys.argv[1:]), "machine": platform.machine(),
              "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "families": {}}
    lines = ["# Saved activations' sensitivity (GACT's), on PyTorch's twin of tessera's blocks", "",
             f"`{report['command']}` ({report['date']}): the twin trained {args.steps} steps on the bundled corpus, "
             f"then each tensor a block saves rounded alone (in every block) to int4 and int8; the gradient's relative "
             f"error over {args.batches} batches of {BATCH} x {SEQ}. bench/activation_sensitivity.py says how.", ""]
    for family in args.families.split(","):
        torch.manual_seed(0)
        model = GPT(256, SEQ, 4, 4, 128) if family == "gpt" else Llama(256, 4, 4, 2, 128, 352, 10000.0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(args.steps):
            x, y = batch(g)
            loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        sdpa = F.scaled_dot_product_attention
        held = [batch(torch.Generator().manual_seed(7 + i)) for i in range(args.batches)]

        def gradients(rule, x, y):
            hooks = Rounding(weights, rule)

            def core(*a, **kw):
                hooks.in_core = True
                try:
                    return sdpa(*a, **kw)
                finally:
                    hooks.in_core = False
            forwards = [block.forward for block in model.h]
            for block, forward in zip(model.h, forwards):
                def hooked(*a, forward=forward, **kw):
                    hooks.slot = 0
                    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
                        return forward(*a, **kw)
                block.forward = hooked
            F.scaled_dot_product_attention = core
            try:
                model.zero_grad()
                model(x, y).backward()
            finally:
                F.scaled_dot_product_attention = sdpa
                for block, forward in zip(model.h, forwards):
                    block.forward = forward
            return torch.cat([p.grad.flatten() for p in model.parameters()]), hooks.seen

        exact = [gradients(lambda s, c: None, x, y)[0] for x, y in held]

        def error(rule):
            errs, seen = [], []
            for (x, y), g0 in zip(held, exact):
                g1, seen = gradients(rule, x, y)
                errs.append(((g1 - g0).norm() / g0.norm()).item())
            return sum(errs) / len(errs), seen

        _, seen = error(lambda s, c: None)
        slots = sorted({(s, shape, n, core) for s, shape, n, core in seen})
        per_token = BATCH * SEQ
        rows = []
        for slot, shape, n, core in slots:
            e4, _ = error(lambda s, c, slot=slot: 7 if s == slot else None)
            e8, _ = error(lambda s, c, slot=slot: 127 if s == slot else None)
            rows.append({"slot": slot, "shape": list(shape), "per_token": n / per_token, "core": core, "int4": e4, "int8": e8})
        total = sum(r["per_token"] for r in rows)
        core_share = sum(r["per_token"] for r in rows if r["core"]) / total
        scale_bits = 32 / GROUP
        wholes = [("every tensor int8", lambda s, c: 127, 8 + scale_bits),
                  ("every tensor int4", lambda s, c: 7, 4 + scale_bits),
                  ("int4, the core's int8", lambda s, c: 127 if c else 7,
                   4 * (1 - core_share) + 8 * core_share + scale_bits)]
        blocks = [{"name": name, "error": error(rule)[0], "bits": bits} for name, rule, bits in wholes]
        report["families"][family] = {"tensors": rows, "blocks": blocks, "core_share": core_share}
        lines += [f"## {family}", "", "| saved tensor | shape | elements per token | in the core | int4 alone | int8 alone |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['slot']} | {'x'.join(map(str, r['shape']))} | {r['per_token']:.0f} | "
                         f"{'yes' if r['core'] else ''} | {r['int4']:.4f} | {r['int8']:.5f} |")
        lines += ["", f"The core holds {100 * core_share:.0f}% of the encodable elements.", "",
                  "| whole block | gradient's relative error | bits per element |", "|---|---|---|"]
        for b in blocks:
            lines.append(f"| {b['name']} | {b['error']:.4f} | {b['bits']:.2f} |")
        lines.append("")
        print("\n".join(lines[-len(rows) - 12:]), flush=True)
    out = pathlib.Path(args.out)
    (out / "activation_sensitivity_cpu.md").write_text("\n".join(lines))
    (out / "activation_sensitivity_cpu.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
