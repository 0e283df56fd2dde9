"""Golden PowerSGD steps for tessera's gradient compression (tests/distributed/test_compression.cpp).

The reference is PyTorch's own DDP hook, torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook,
run on one bucket of a 2-rank job. PowerSGD is linear in the gradients until P is orthogonalised and
only ever all-reduces P = M Q and Q = M^T P, so a 2-rank step equals the hook's step on one rank
fed with the mean of the two ranks' gradients: the applied update is the same, and the hook's
error (residual) is the mean of the two ranks' residuals. The hook therefore runs here with a
one-member process group whose all_reduce is the identity (a fake group: no sockets needed).

Settings (tessera's side in the metadata): rank 3 (the hook orthogonalises with QR for rank > 2,
as tessera always does), start_powerSGD_iter 2, min_compression_rate 1 (compress whenever it
saves bytes), error feedback and warm start on. The first Q is tessera's: randn(sum m r) from a
CPU generator seeded with the bucket index, placed in the hook's Q memory before its first
compressed step so that it is used instead of the hook's own random Q.

Bucket BUCKET holds gradients w [12, 8], t [6, 2, 5] (viewed as [6, 10]), b [8] (a vector, sent
whole), s [3, 2] (rank 2 would cost 10 > 6 elements: sent whole), u [10, 10].

File compression_powersgd.safetensors:
  grad.s<k>.r<i>.<name>   rank i's gradient at step k (k < STEPS, i < WORLD)
  applied.s<k>.<name>     the mean the hook returns at step k (every rank's result)
  residual                [bucket numel] the hook's error after the last step: the ranks' mean residual
  q                       [sum m r] the hook's Q after the last step (each [m, r] row-major, bucket order)
  q0                      [sum m r] the first Q
"""
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

import st

NAMES = ["w", "t", "b", "s", "u"]
SHAPES = {"w": (12, 8), "t": (6, 2, 5), "b": (8,), "s": (3, 2), "u": (10, 10)}
RANK = 3
START = 2
STEPS = 5
WORLD = 2
BUCKET = 5


class _OneRankGroup:
    def size(self):
        return 1


class _Done:
    """What dist.all_reduce(..., async_op=True) returns, for a one-member group: done, unchanged."""

    def __init__(self, tensor):
        self.future = torch.futures.Future()
        self.future.set_result([tensor])

    def get_future(self):
        return self.future


class _Bucket:
    """The part of dist.GradBucket the hook uses: a flat buffer and per-parameter views of it."""

    def __init__(self, buffer):
        self.flat = buffer

    def buffer(self):
        return self.flat

    def index(self):
        return BUCKET

    def is_last(self):
        return True

    def gradients(self):
        views, offset = [], 0
        for name in NAMES:
            n = torch.Size(SHAPES[name]).numel()
            views.append(self.flat[offset:offset + n].view(SHAPES[name]))
            offset += n
        return views


def compressed_shapes():
    """[n, m, r] of each matrix the hook compresses, in bucket order."""
    out = []
    for name in NAMES:
        shape = SHAPES[name]
        if len(shape) < 2:
            continue
        n = shape[0]
        m = torch.Size(shape).numel() // n
        r = min(n, m, RANK)
        if (n + m) * r < n * m:
            out.append((n, m, r))
    return out


def generate(out_dir) -> None:
    gen = torch.Generator().manual_seed(1234)
    grads = [[{n: torch.randn(SHAPES[n], generator=gen) for n in NAMES} for _ in range(WORLD)] for _ in range(STEPS)]
    shapes = compressed_shapes()
    q_numel = sum(m * r for _, m, r in shapes)
    p_numel = sum(n * r for n, _, r in shapes)
    q0 = torch.randn(q_numel, generator=torch.Generator().manual_seed(BUCKET))

    state = powerSGD_hook.PowerSGDState(process_group=_OneRankGroup(), matrix_approximation_rank=RANK,
                                        start_powerSGD_iter=START, min_compression_rate=1,
                                        use_error_feedback=True, warm_start=True)
    state.q_memory_dict[BUCKET] = q0.clone()
    state.p_memory_dict[BUCKET] = torch.empty(p_numel)

    out = {"q0": q0}
    with mock.patch.object(dist, "all_reduce", lambda tensor, group=None, async_op=False: _Done(tensor)):
        for k in range(STEPS):
            for i in range(WORLD):
                out.update({f"grad.s{k}.r{i}.{n}": grads[k][i][n] for n in NAMES})
            mean = torch.cat([sum(grads[k][i][n] for i in range(WORLD)).reshape(-1) / WORLD for n in NAMES])
            bucket = _Bucket(mean)
            result = powerSGD_hook.powerSGD_hook(state, bucket).wait()
            views = _Bucket(result).gradients()
            out.update({f"applied.s{k}.{n}": v.clone() for n, v in zip(NAMES, views)})
    out["residual"] = state.error_dict[BUCKET]
    out["q"] = state.q_memory_dict[BUCKET]
    st.save(out_dir / "compression_powersgd.safetensors", out,
            {"rank": RANK, "start_step": START, "steps": STEPS, "world": WORLD, "bucket": BUCKET})
