#!/usr/bin/env python3
"""The expert computation of a dropless MoE layer, three ways, on the ATen kernels tessera calls.

Usage: ~/.cache/tessera/venv-torch-2.11.0/bin/python bench/expert_compute.py [--out bench/results]

Rows of E experts one after the other (variable counts drawn from a skewed routing), each expert
gelu_tanh(rows @ w_fc[e] + b_fc[e]) @ w_proj[e] + b_proj[e]; forward and backward, fp32, one thread:
  loop      one matmul pair per expert over its own rows (what model/moe.cpp runs for dropless);
  padded    every expert padded to the busiest count, one batched matmul pair (baddbmm), the padding
            computed and thrown away (what capacity routing runs, with the capacity as the pad);
  grouped   torch._grouped_mm with the count offsets (16-byte aligned strides needed).
Each is checked against the loop (outputs and weight gradients) before it is timed; best of 5
medians of 10 runs. Results: OUT/expert_compute_cpu.md.
"""
import argparse
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F


def counts_for(tokens, experts, skew, gen):
    p = torch.softmax(torch.randn(experts, generator=gen) * skew, 0)
    return torch.bincount(torch.multinomial(p, tokens, replacement=True, generator=gen), minlength=experts).tolist()


def loop(x, counts, w1, b1, w2, b2):
    out, first = [], 0
    for e, n in enumerate(counts):
        h = F.gelu(x[first:first + n] @ w1[e] + b1[e], approximate="tanh")
        out.append(h @ w2[e] + b2[e])
        first += n
    return torch.cat(out)


def padded(x, counts, w1, b1, w2, b2):
    E, cap, C = len(counts), max(counts), x.shape[1]
    index = torch.cat([e * cap + torch.arange(n) for e, n in enumerate(counts)])
    buf = x.new_zeros(E * cap, C).index_copy(0, index, x).view(E, cap, C)
    h = F.gelu(torch.baddbmm(b1.unsqueeze(1), buf, w1), approximate="tanh")
    return torch.baddbmm(b2.unsqueeze(1), h, w2).view(E * cap, C).index_select(0, index)


def grouped(x, counts, w1, b1, w2, b2):
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    bias1 = torch.repeat_interleave(b1, torch.tensor(counts), dim=0)
    bias2 = torch.repeat_interleave(b2, torch.tensor(counts), dim=0)
    h = F.gelu(torch._grouped_mm(x, w1, offs=offs) + bias1, approximate="tanh")
    return torch._grouped_mm(h, w2, offs=offs) + bias2


def timed(fn, args, reps=10, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        times = []
        for _ in range(reps):
            for t in args:
                t.grad = None
            start = time.perf_counter()
            fn(*args).square().sum().backward()
            times.append(time.perf_counter() - start)
        best = min(best, statistics.median(times))
    return best


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--out", default="bench/results")
    args = a.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    lines = ["# Dropless expert computation on CPU (fp32, one thread, forward + backward)", "",
             f"`bench/expert_compute.py` with torch {torch.__version__} (the ATen kernels libtorch runs); "
             "median ms, best of 5 x 10 runs; skew: router logits' scale (0: uniform routing).", "",
             "| E | C | H | tokens x k | skew | busiest / mean | loop ms | padded ms | grouped ms |", "|---|---|---|---|---|---|---|---|---|"]
    for E, C, H, rows, skew in [(8, 128, 512, 2048, 0.0), (8, 128, 512, 2048, 1.5), (32, 128, 512, 4096, 1.0),
                                (8, 512, 2048, 4096, 1.0)]:
        counts = counts_for(rows, E, skew, gen)
        x = torch.randn(rows, C, generator=gen, requires_grad=True)
        w1 = (torch.randn(E, C, H, generator=gen) * 0.02).requires_grad_()
        b1 = torch.zeros(E, H, requires_grad=True)
        w2 = (torch.randn(E, H, C, generator=gen) * 0.02).requires_grad_()
        b2 = torch.zeros(E, C, requires_grad=True)
        params = (x, w1, b1, w2, b2)
        ref = loop(x, counts, w1, b1, w2, b2)
        ref_grad = torch.autograd.grad(ref.square().sum(), (w1,))[0]
        cells = []
        for fn in (loop, padded, grouped):
            try:
                y = fn(x, counts, w1, b1, w2, b2)
                g = torch.autograd.grad(y.square().sum(), (w1,))[0]
                ok = torch.allclose(y, ref, atol=1e-5, rtol=1e-4) and torch.allclose(g, ref_grad, atol=1e-5, rtol=1e-4)
                cells.append(f"{timed(lambda *p: fn(p[0], counts, *p[1:]), params) * 1e3:.2f}" if ok else "wrong")
            except RuntimeError as e:
                cells.append("fails: " + str(e).splitlines()[0][:60])
        lines.append(f"| {E} | {C} | {H} | {rows} | {skew} | {max(counts) / (rows / E):.2f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "expert_compute_cpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
