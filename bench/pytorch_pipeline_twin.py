#!/usr/bin/env python3
"""The PyTorch twin of `tessera bench --nproc P --set parallel.pp=P`: the GPT of bench/pytorch_twin.py
split into pipeline stages and trained with torch.distributed.pipelining on P processes (Gloo, CPU),
one step = M micro-batches, AdamW (decay on matrices only) with the global gradient norm clipped at
1.0 across the stages. Rank 0 prints one JSON object (median step over the timed steps, or the
schedule's error when PyTorch cannot run it here).

Schedules (tessera's name -> PyTorch's class; stages per rank):
  gpipe -> ScheduleGPipe (1), 1f1b -> Schedule1F1B (1), interleaved -> ScheduleInterleaved1F1B (2,
  loop placement), izb -> ScheduleInterleavedZeroBubble (2, loop), zbv -> ScheduleZBVZeroBubble (2, V
  placement), dualpipev -> ScheduleDualPipeV (2, V).
The blocks are cut evenly over the stages; the first stage embeds, the last holds ln_f and the head.
The head is the token embedding transposed as in one process when both are on one rank (V
placement); otherwise the last stage holds a copy and, as tessera does, the two copies' gradients
are summed over the two ranks before the optimizer step (one all-reduce), so both run the same math.

usage: bench/pytorch_pipeline_twin.py --schedule 1f1b [--pp 2 --microbatches 8 --batch 4 ...]
"""
import argparse
import json
import os
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as pl

from pytorch_twin import Block

SCHEDULES = {"gpipe": ("ScheduleGPipe", "single"), "1f1b": ("Schedule1F1B", "single"),
             "interleaved": ("ScheduleInterleaved1F1B", "loop"), "izb": ("ScheduleInterleavedZeroBubble", "loop"),
             "zbv": ("ScheduleZBVZeroBubble", "v"), "dualpipev": ("ScheduleDualPipeV", "v")}


class Stage(nn.Module):
    """Blocks [first, end) of the model, with the embedding on stage 0 and ln_f + head on the last."""

    def __init__(self, a, index, stages, wte):
        super().__init__()
        per = a.layers // stages
        self.first, self.last = index == 0, index == stages - 1
        self.wte = wte if self.first else None
        self.wpe = nn.Embedding(a.block, a.embd) if self.first else None
        self.h = nn.ModuleList(Block(a.embd, a.heads) for _ in range(per))
        self.ln_f = nn.LayerNorm(a.embd) if self.last else None
        if self.last:
            self.head = wte if wte is not None else nn.Parameter(torch.empty(a.vocab, a.embd))
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for block in self.h:
            x = block(x)
        if self.last:
            w = self.head.weight if isinstance(self.head, nn.Embedding) else self.head
            x = self.ln_f(x) @ w.t()
        return x


def stage_indices(placement, rank, pp):
    if placement == "single":
        return [rank]
    if placement == "loop":
        return [rank, rank + pp]
    return [rank, 2 * pp - 1 - rank]


def worker(rank, a, port, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.pp)
    try:
        result = run(rank, a)
    except Exception as e:  # a schedule PyTorch cannot run here: reported, not hidden
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  "trace": traceback.format_exc()[-1500:]}
    out.put((rank, result))
    try:
        dist.destroy_process_group()
    except Exception:  # a peer already gone
        pass


def run(rank, a):
    cls, placement = SCHEDULES[a.schedule]
    indices = stage_indices(placement, rank, a.pp)
    n_stages = a.pp * len(indices)
    torch.manual_seed(1337)
    wte = nn.Embedding(a.vocab, a.embd)
    tie = 0 in indices and n_stages - 1 in indices
    modules = {i: Stage(a, i, n_stages, wte if (i == 0 or (i == n_stages - 1 and tie)) else None) for i in indices}
    stages = [pl.PipelineStage(modules[i], i, n_stages, torch.device("cpu")) for i in indices]
    params = list({id(p): p for m in modules.values() for p in m.parameters()}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    # The two copies of the tied embedding: rank 0's wte and the last stage's head (its own copy
    # unless the rank holds both ends); the norm counts the head's copy in wte only.
    head_copy = [m.head for m in modules.values() if m.last and not isinstance(m.head, nn.Embedding)]
    copies = [m.wte.weight for m in modules.values() if m.first] + head_copy
    counted = [p for p in params if not any(p is c for c in head_copy)]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    schedule_cls = getattr(pl, cls)
    schedule = schedule_cls(stages if placement != "single" else stages[0], a.microbatches, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(a.vocab, (a.batch * a.microbatches, a.seq + 1), generator=g)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    holds_first = 0 in indices
    holds_last = n_stages - 1 in indices
    seconds = []
    for i in range(a.warmup + a.steps):
        dist.barrier()
        start = time.perf_counter()
        losses = [] if holds_last else None
        args = (x,) if holds_first else ()
        schedule.step(*args, target=y if holds_last else None, losses=losses)
        if not tie:  # the tied embedding's two copies: gradients summed, as one process has one
            for c in copies:
                if c.grad is None:
                    c.grad = torch.zeros_like(c)
                dist.all_reduce(c.grad)
        # The norm over every stage, the head's copy of the embedding counted once (in wte).
        squares = torch.stack([p.grad.pow(2).sum() for p in counted if p.grad is not None]).sum()
        dist.all_reduce(squares)
        norm = squares.sqrt()
        scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    timed = seconds[a.warmup:]
    median = sorted(timed)[len(timed) // 2]
    tokens_per_step = a.batch * a.microbatches * a.seq
    return {"peer": "pytorch", "schedule": a.schedule, "pytorch_class": cls, "pp": a.pp, "stages": n_stages,
            "microbatches": a.microbatches, "step_s": timed, "median_step_s": median,
            "tokens_per_s": tokens_per_step / median, "torch": torch.__version__, "threads": torch.get_num_threads()}


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--schedule", choices=sorted(SCHEDULES), required=True)
    for name, default in [("pp", 2), ("microbatches", 8), ("vocab", 256), ("block", 128), ("layers", 8),
                          ("heads", 4), ("embd", 128), ("batch", 4), ("seq", 128), ("steps", 5), ("warmup", 2),
                          ("threads", 1), ("port", 29533)]:
        a.add_argument(f"--{name}", type=int, default=default)
    a = a.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, a.port, out)) for r in range(a.pp)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    errors = {r: results[r]["error"] for r in sorted(results) if "error" in results[r]}
    # The first rank's own failure, not a peer's report that it went away.
    result = results[0] if not errors else {
        "error": next((e for e in errors.values() if "Connection closed by peer" not in e), next(iter(errors.values()))),
        "errors_by_rank": errors, "schedule": a.schedule, "pytorch_class": SCHEDULES[a.schedule][0]}
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
