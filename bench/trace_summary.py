#!/usr/bin/env python3
"""Where a traced training step's time goes on the device: sums a Chrome trace written by
`tessera_profile_step --trace` (bench/profile_step.cpp) or `pytorch_twin.py --trace` into device
time per kernel class and per kernel, and the device's idle time (the span of the traced steps not
covered by any kernel, copy or memset: time the device waited for the host).

Usage: trace_summary.py TRACE.json [--steps N] [--top 15] [--json]

Kernel classes are read from kernel names (gemm, attention, optimizer, cross-entropy, norm,
elementwise, reduction, copy, other); --steps divides every figure into one step's.
"""
import argparse
import collections
import json
import re

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

CLASSES = [
    ("gemm", r"gemm|cutlass|sm90_xmma|nvjet|cublas|matmul"),
    ("attention", r"flash|fmha|attention|efficient_attention"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("cross-entropy", r"log_softmax|softmax|nll_loss|cross_entropy"),
    ("norm", r"layer_norm|layernorm|LayerNorm|rms"),
    ("reduction", r"reduce|norm_kernel|sum_kernel"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|GeluCUDA|add_kernel|mul_kernel|fill|triton"),
]


def kernel_class(name, cat):
    if cat != "kernel":
        return "copy/memset"
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def busy_time(intervals):
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(path, steps):
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    if not device:
        return {"trace": path, "device_events": 0}
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in device]
    span = max(b for _, b in intervals) - min(a for a, _ in intervals)
    busy = busy_time(intervals)
    by_class, by_kernel = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for e in device:
        by_class[kernel_class(e["name"], e["cat"])] += e["dur"]
        by_kernel[e["name"][:100]] += e["dur"]
        counts[e["name"][:100]] += 1
    ms = lambda us: us / 1000.0 / steps
    return {
        "trace": path,
        "device_events_per_step": len(device) / steps,
        "span_ms": ms(span),
        "busy_ms": ms(busy),
        "idle_fraction": 1.0 - busy / span,
        "by_class_ms": {k: ms(v) for k, v in by_class.most_common()},
        "by_kernel_ms": [(k, ms(v), counts[k] / steps) for k, v in by_kernel.most_common()],
    }


def main():
    a = argparse.ArgumentParser()
    a.add_argument("trace")
    a.add_argument("--steps", type=int, default=1)
    a.add_argument("--top", type=int, default=15)
    a.add_argument("--json", action="store_true")
    args = a.parse_args()
    s = summarize(args.trace, args.steps)
    if args.json:
        s["by_kernel_ms"] = s.get("by_kernel_ms", [])[: args.top]
        print(json.dumps(s))
        return
    if not s.get("device_events_per_step"):
        print(f"{args.trace}: no device events")
        return
    print(f"{args.trace}: per step {s['span_ms']:.2f} ms traced, device busy {s['busy_ms']:.2f} ms, "
          f"idle {100 * s['idle_fraction']:.1f}%, {s['device_events_per_step']:.0f} device events")
    for k, v in s["by_class_ms"].items():
        print(f"  {k:<14} {v:9.2f} ms  {100 * v / s['busy_ms']:5.1f}%")
    for name, v, calls in s["by_kernel_ms"][: args.top]:
        print(f"  {v:9.3f} ms {calls:6.0f}x  {name}")


if __name__ == "__main__":
    main()
