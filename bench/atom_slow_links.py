#!/usr/bin/env python3
"""ATOM peers against pipeline and data parallelism on four hosts joined by slow links.

    sudo python3 bench/atom_slow_links.py BUILD_DIR [--rates none,1gbit,100mbit,10mbit]
        [--modes dp,gpipe,1f1b,batch,diloco] [--steps N] [--out bench/results/atom_slow_links_cpu]

Four hosts are four network namespaces (tsr0..tsr3, 10.77.0.1-4) on one Linux bridge; each host's
link is limited in both directions with `tc qdisc ... tbf rate R` (on its own end of the veth pair
and on the bridge's), as a host whose network card runs at R. For each rate ("none": the veth
pairs unlimited) the same tiny_gpt trains on the four hosts, 64 sequences of 128 tokens per
optimizer step, in each mode:
  dp      tessera train --nnodes 4: data parallelism, 16 sequences per rank, one ring all-reduce
          of the float32 gradients per step;
  gpipe   tessera train --nnodes 4 --set parallel.pp=4 (one block per host), 8 micro-batches of 8,
  1f1b    GPipe or 1F1B: float32 activations and their gradients cross every stage boundary for
          every micro-batch;
  batch   four `tessera peer`s, swarm.sync = batch, target batch 64 (16 per peer per local step):
          the peers' all-reduce of float32 gradients (round a ring) once per swarm step, each round
          started with the local step that closes it (swarm.overlap_rounds = always, the default);
  batch_after  the same with swarm.overlap_rounds = never: each round starts after the backward;
  batch_auto   the same with swarm.overlap_rounds = auto: the swarm times both ways on rounds 2-5
               and each round's host tells its group the faster, which every member follows; its
               throughput is counted from step 7, the way chosen (a probe is 4 rounds in every
               200), and the result names the way the peers followed;
  batch_butterfly  batch with swarm.mean_all_reduce = butterfly: the mean by the butterfly instead of
               round a ring (the default; src/atom/averaging.h; bench/results/swarm_ring_slow_links_cpu.md
               compared them when the butterfly was the default, as modes batch and batch_ring);
  diloco  four `tessera peer`s, swarm.sync = diloco, int8 pseudo-gradients every 10 local steps
          of 16 (the setting that ends within 4% of batch mode's loss: bench/results/atom_swarm_cpu.md).
Throughput is the samples per second of the whole run's steady state: from each run's
metrics.jsonl (one line per step), samples between a warm-up step and the last over the time
between them (summed over the peers for the swarm modes). Wire bytes are each host's eth0
tx_bytes over the whole run (start-up included) per sample; CPU a sample is the four hosts' user and
system time (their rusage as children of this script, start-up included) over the run's samples. The four hosts share this machine's
cores, as they do in every mode; the rate "none" row is what the cores allow.

Writes OUT.json, OUT.md (tables) and OUT.svg (samples/s against the link rate, log scale); --render
rewrites the last two from OUT.json.
Needs root (ip netns, tc); removes its namespaces and bridge when it ends.
"""
import argparse
import atexit
import json
import math
import resource
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from swarm_peers import ROOT, keygen, metrics, prepared_corpus, start_peer

HOSTS = 4
BRIDGE = "tsrbr"
SEQ_LEN = 128
GLOBAL_BATCH = 64
MODES = {
    "dp": "data parallelism",
    "gpipe": "pipeline, GPipe",
    "1f1b": "pipeline, 1F1B",
    "batch": "ATOM peers, batch",
    "batch_after": "ATOM batch, rounds after the backward",
    "batch_auto": "ATOM batch, the swarm's timed choice",
    "batch_butterfly": "ATOM batch, the mean by the butterfly",
    "diloco": "ATOM peers, DiLoCo int8 / 10 steps",
}
RATE_BYTES = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8}


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def host_ip(i):
    return "10.77.0.%d" % (i + 1)


class Hosts:
    """`count` namespaces (tsr0.., host_ip(i)) on one bridge; set_rate() changes every link's limit."""

    def __init__(self, count=HOSTS):
        self.count = count
        self.close()  # a previous run that was killed may have left them
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "link", "set", BRIDGE, "up")
        for i in range(count):
            ns = "tsr%d" % i
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "tsrv%d" % i, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", "tsrv%d" % i, "master", BRIDGE, "up")
            sh("ip", "-n", ns, "addr", "add", host_ip(i) + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        atexit.register(self.close)

    def close(self):
        for i in range(max(self.count, HOSTS)):  # also what a run with more hosts left
            sh("ip", "netns", "del", "tsr%d" % i, check=False)
            sh("ip", "link", "del", "tsrv%d" % i, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)

    def set_rate(self, rate):
        for i in range(self.count):
            for where in (["ip", "netns", "exec", "tsr%d" % i, "tc"], ["tc"]):
                dev = "eth0" if len(where) > 1 else "tsrv%d" % i
                subprocess.run(where + ["qdisc", "del", "dev", dev, "root"], capture_output=True)
                if rate != "none":
                    # Burst: 10 ms at the rate (at least 16 KiB); a queue of 200 ms.
                    burst = max(16384, int(rate_bytes(rate) / 100))
                    subprocess.run(where + ["qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst",
                                            str(burst), "latency", "200ms"], check=True)

    def tx_bytes(self):
        return [int(sh("ip", "netns", "exec", "tsr%d" % i, "cat", "/sys/class/net/eth0/statistics/tx_bytes").stdout)
                for i in range(self.count)]


def rate_bytes(rate):
    m = re.fullmatch(r"([0-9.]+)(gbit|mbit|kbit)", rate)
    if not m:
        sys.exit("--rates: %r is not none or N{gbit,mbit,kbit}" % rate)
    return float(m.group(1)) * RATE_BYTES[m.group(2)]


def measure_link(work):
    """MB/s one host receives from another over its link (a 4 s TCP stream), to show the limit holds.
    Counted at the receiver, from its first byte to its last: the sender's count would include the
    bytes still queued in its socket's buffer when it stops (at 10 Mbit that read 1.5 MB/s for
    tbf's 1.25)."""
    probe = os.path.join(work, "probe.py")
    with open(probe, "w") as f:
        f.write("import socket, sys, time\n"
                "if sys.argv[1] == 'serve':\n"
                "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                "    s.bind((sys.argv[2], 5001)); s.listen(1); c, _ = s.accept()\n"
                "    first = c.recv(1 << 20); t = time.time(); n = 0\n"
                "    while True:\n"
                "        b = c.recv(1 << 20)\n"
                "        if not b: break\n"
                "        n += len(b); last = time.time()\n"
                "    print(n / (last - t) / 1e6)\n"
                "else:\n"
                "    c = socket.create_connection((sys.argv[2], 5001)); buf = b'x' * (1 << 16)\n"
                "    t = time.time()\n"
                "    while time.time() - t < 4: c.sendall(buf)\n"
                "    c.close()\n")
    server = subprocess.Popen(["ip", "netns", "exec", "tsr1", sys.executable, probe, "serve", host_ip(1)],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    sh("ip", "netns", "exec", "tsr0", sys.executable, probe, "send", host_ip(1))
    received, _ = server.communicate(timeout=60)
    return float(received)


ALL_REDUCE_WORKER = r'''
import sys, time, torch, torch.distributed as dist
rank, world, master, sizes, reps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo", init_method="tcp://%s:5002" % master, rank=rank, world_size=world)
for size in map(int, sizes.split(",")):
    x = torch.ones(size // 4)
    dist.all_reduce(x)
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    if rank == 0:
        print(size, sorted(times)[reps // 2], flush=True)
dist.destroy_process_group()
'''


def torch_python(build):
    """The interpreter with torch that BUILD was configured with (CMake's TESSERA_PYTHON: scripts/install.sh's
    venv), else this one."""
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("TESSERA_PYTHON:"):
                return line.split("=", 1)[1].strip()
    return sys.executable


def measure_all_reduce(build, work, rate, hosts=HOSTS):
    """What a ring all-reduce of the hosts achieves over their links, as the planner's cluster file
    counts it ([intra_node] bandwidth_gbs and latency_us): PyTorch's Gloo all-reduce of float32 (the
    library tessera's data parallelism calls) among one process per host at three sizes, the median of
    a few calls each, fitted as time = 2 min(n - 1, log2 n) latency + 2 (n - 1) / n bytes / bandwidth.
    Returns {"bus_mb_per_s", "latency_us", "points": [[bytes, seconds], ...]}."""
    worker = os.path.join(work, "all_reduce.py")
    with open(worker, "w") as f:
        f.write(ALL_REDUCE_WORKER)
    slow = rate != "none" and rate_bytes(rate) < 2e6
    sizes, reps = ([65536, 524288, 2097152], 3) if slow else ([65536, 1048576, 4194304], 7)
    procs = [subprocess.Popen(["ip", "netns", "exec", "tsr%d" % i, torch_python(build), worker, str(i), str(hosts),
                               host_ip(0), ",".join(map(str, sizes)), str(reps)],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0", TORCH_CPP_LOG_LEVEL="ERROR"))
             for i in range(hosts)]
    out = [p.communicate(timeout=600)[0] for p in procs][0]
    points = [[int(b), float(t)] for b, t in (line.split() for line in out.split("\n") if line.strip())]
    n = float(hosts)
    xs = [2 * (n - 1) / n * b for b, _ in points]
    ys = [t for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = max(0.0, my - slope * mx)
    steps = 2 * min(hosts - 1, math.ceil(math.log2(hosts)))
    return {"bus_mb_per_s": 1e-6 / slope, "latency_us": 1e6 * intercept / steps, "points": points}


def common_settings(data):
    return ["--set", "data.path=" + data, "--set", "train.threads=1", "--set", "train.log_every=1",
            "--set", "eval.every=1000000", "--set", "checkpoint.every=1000000", "--set", "optim.warmup_steps=5"]


def commands(build, mode, run_dir, data, key, steps):
    """Each host's command line for one run."""
    tessera = os.path.join(build, "tessera")
    common = common_settings(data) + ["--set", "train.steps=%d" % steps]
    out = []
    for i in range(HOSTS):
        host_dir = os.path.join(run_dir, "host%d" % i)
        if mode in ("dp", "gpipe", "1f1b"):
            # One run directory for the four hosts, as on a shared filesystem (checkpoint shards).
            args = [tessera, "train", "--config", "tiny_gpt", "--out", os.path.join(run_dir, "train"), "--nproc", "1",
                    "--nnodes",
                    str(HOSTS), "--node-rank", str(i), "--master", host_ip(0) + ":29500"] + common
            if mode == "dp":
                args += ["--set", "train.batch_size=%d" % (GLOBAL_BATCH // HOSTS)]
            else:
                args += ["--set", "parallel.pp=%d" % HOSTS, "--set", "parallel.pp_schedule=" + mode,
                         "--set", "train.batch_size=8", "--set", "train.grad_accum=%d" % (GLOBAL_BATCH // 8)]
        else:
            args = [tessera, "peer", "--config", "tiny_gpt", "--swarm", "slow", "--listen", host_ip(i) + ":7000",
                    "--out", host_dir, "--set", "swarm.key_file=" + key, "--set", "swarm.min_peers=%d" % HOSTS,
                    "--set", "train.batch_size=%d" % (GLOBAL_BATCH // HOSTS)] + common
            if i > 0:
                args += ["--initial-peer", host_ip(0) + ":7000"]
            if mode.startswith("batch"):
                args += ["--set", "swarm.sync=batch", "--set", "swarm.target_batch_size=%d" % GLOBAL_BATCH]
                if mode == "batch_after":
                    args += ["--set", "swarm.overlap_rounds=never"]
                if mode == "batch_auto":
                    args += ["--set", "swarm.overlap_rounds=auto"]
                if mode == "batch_butterfly":
                    args += ["--set", "swarm.mean_all_reduce=butterfly"]
            else:
                args += ["--set", "swarm.sync=diloco", "--set", "swarm.inner_steps=10",
                         "--set", "swarm.pseudo_gradient_dtype=int8"]
        out.append((host_dir, ["ip", "netns", "exec", "tsr%d" % i] + args))
    return out


def train_metrics(host_dirs):
    return metrics(os.path.join(os.path.dirname(host_dirs[0]), "train"))


def throughput(mode, host_dirs, warm):
    """Steady-state samples/s: samples after step `warm` over the time they took."""
    def rate(rows, samples):
        rows = [r for r in rows if "elapsed_s" in r and "step" in r and "loss" in r]
        first = next(r for r in rows if r["step"] >= warm)
        lastrow = rows[-1]
        return (samples(lastrow) - samples(first)) / (lastrow["elapsed_s"] - first["elapsed_s"])

    if mode in ("dp", "gpipe", "1f1b"):
        return rate(train_metrics(host_dirs), lambda r: r["tokens"] / SEQ_LEN)
    return sum(rate([r for r in metrics(d) if "swarm" in r],
                    lambda r: r["swarm"]["samples_processed"]) for d in host_dirs)


def total_samples(mode, host_dirs):
    if mode in ("dp", "gpipe", "1f1b"):
        return [r for r in train_metrics(host_dirs) if "tokens" in r][-1]["tokens"] / SEQ_LEN
    return sum([r for r in metrics(d) if "swarm" in r][-1]["swarm"]["samples_processed"]
               for d in host_dirs)


def steps_for(mode, rate, steps=None):
    """Optimizer steps (local steps for DiLoCo) a run takes: enough for a steady state, bounded in time;
    `steps` (--steps) instead where given."""
    if steps:
        return steps
    if mode == "diloco":
        return 60
    if rate == "none":
        return 30
    slow = rate_bytes(rate) < 2e6
    return 8 if slow else 20


def run(build, work, hosts, mode, rate, data, key, steps=None, repeat=0):
    run_dir = os.path.join(work, "%s_%s_%d" % (mode, rate, repeat))
    os.makedirs(run_dir)
    steps = steps_for(mode, rate, steps)
    before = hosts.tx_bytes()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = []
    for i, (host_dir, cmd) in enumerate(commands(build, mode, run_dir, data, key, steps)):
        if mode not in ("dp", "gpipe", "1f1b"):  # the first peer listens before the others start from it
            procs.append(start_peer(cmd, host_dir, wait=i == 0)[0])
        else:
            procs.append(subprocess.Popen(cmd, stdout=open(host_dir + ".log", "w"), stderr=subprocess.STDOUT))
    deadline = time.time() + 900
    for p in procs:
        try:
            code = p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit("%s at %s: did not finish in 900 s; logs in %s" % (mode, rate, run_dir))
        if code != 0:
            for q in procs:
                q.kill()
            sys.exit("%s at %s: a host exited with %d; logs in %s" % (mode, rate, code, run_dir))
    sent = sum(a - b for a, b in zip(hosts.tx_bytes(), before))
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    host_dirs = [os.path.join(run_dir, "host%d" % i) for i in range(HOSTS)]
    warm = 10 if mode == "diloco" else 7 if mode == "batch_auto" else 2
    samples = total_samples(mode, host_dirs)
    result = {"mode": mode, "rate": rate, "repeat": repeat, "steps": steps,
              "samples_per_s": throughput(mode, host_dirs, warm),
              "wire_bytes_per_sample": sent / samples, "cpu_ms_per_sample": 1000 * cpu_s / samples}
    if mode == "batch_auto":
        followed = {[r for r in metrics(d) if "swarm" in r][-1]["swarm"]["overlap_followed"] for d in host_dirs}
        result["ways_followed"] = sorted("overlapped" if f else "after the backward" for f in followed)
    return result


def svg(results, rates, modes, path):
    """samples/s (log scale) against the link rate, one line per mode."""
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    width, height, left, right, top, bottom = 720, 420, 70, 210, 40, 50
    values = [r["samples_per_s"] for r in results]
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    hi = max(hi, lo + 1)
    x = lambda k: left + (width - left - right) * (k + 0.5) / len(rates)
    y = lambda v: top + (height - top - bottom) * (hi - math.log10(v)) / (hi - lo)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14">tiny_gpt on 4 hosts: samples/s against each host\'s link rate</text>'
           % left]
    for e in range(lo, hi + 1):
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (left, width - right, y(10 ** e),
                                                                                 y(10 ** e)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (left - 6, y(10 ** e) + 4, 10 ** e))
    for k, rate in enumerate(rates):
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x(k), height - bottom + 18,
                                                                           "unlimited" if rate == "none" else rate))
    out.append('<text x="%d" y="%d" text-anchor="middle">link rate per host (tbf)</text>'
               % ((left + width - right) / 2, height - 12))
    out.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">samples/s</text>'
               % ((top + height - bottom) / 2, (top + height - bottom) / 2))
    for m, mode in enumerate(modes):
        pts = [(x(k), y(r["samples_per_s"])) for k, rate in enumerate(rates) for r in results
               if r["mode"] == mode and r["rate"] == rate]
        c = colours[m % len(colours)]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (c, " ".join("%.1f,%.1f" % p for p in pts)))
        out += ['<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>' % (px, py, c) for px, py in pts]
        ly = top + 10 + 20 * m
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (width - right + 12, width - right + 32, ly, ly, c))
        out.append('<text x="%d" y="%d">%s</text>' % (width - right + 38, ly + 4, MODES[mode]))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def label(rate):
    return "unlimited" if rate == "none" else rate


def render(measured, out):
    """OUT.md and OUT.svg from one run's OUT.json contents."""
    results, links, rates, modes = measured["results"], measured["links_mb_per_s"], measured["rates"], measured["modes"]
    # With --repeat, each cell is the repeat of median samples/s (its other columns that run's).
    cells = {}
    for r in results:
        cells.setdefault((r["mode"], r["rate"]), []).append(r)
    at = {k: sorted(v, key=lambda r: r["samples_per_s"])[(len(v) - 1) // 2] for k, v in cells.items()}
    svg(list(at.values()), rates, modes, out + ".svg")
    head = ["| link | " + " | ".join(MODES[m] for m in modes) + " |", "|---|" + "---|" * len(modes)]

    def table(cell):
        return [("| %s | " % label(rate)) + " | ".join(cell(at[(m, rate)], rate) for m in modes) + " |"
                for rate in rates]

    lines = ["Samples per second (the link's rate as one host measured it receiving from another: %s):"
             % ", ".join("%s %.1f MB/s" % (label(r), links[r]) for r in rates), ""]
    if "all_reduce" in measured:
        lines[-1:-1] = ["", "A ring all-reduce of the %d hosts (PyTorch's Gloo, measured%s; bus bandwidth, and latency per "
                        "step): %s." % (HOSTS, " " + measured["links_measured"] if "links_measured" in measured else "",
                                        ", ".join("%s %.2f MB/s, %.0f us" % (label(r), measured["all_reduce"][r]["bus_mb_per_s"],
                                                                            measured["all_reduce"][r]["latency_us"])
                                                  for r in rates))]
    lines += head + table(lambda r, rate: "%.1f" % r["samples_per_s"])
    repeats = sorted({r.get("repeat", 0) for r in results})
    if len(repeats) > 1 and "dp" in modes:
        ratio = {(r["mode"], r["rate"], r.get("repeat", 0)): r["samples_per_s"] for r in results}
        lines += ["", "Each repeat over data parallelism's samples/s in the same repeat (the modes ran one after another "
                  "in each, so a ratio spans minutes, not the whole run):", ""]
        lines += head + table(lambda r, rate: ", ".join("%.2f" % (ratio[(r["mode"], rate, k)] / ratio[("dp", rate, k)])
                                                         for k in repeats))
    auto = [r for r in results if r["mode"] == "batch_auto"]
    if auto:
        lines += ["", "The way the peers followed under swarm.overlap_rounds = auto, each run: " +
                  "; ".join("%s repeat %d: %s" % (label(r["rate"]), r.get("repeat", 0), " and ".join(r["ways_followed"]))
                            for r in auto)]
    pipes = [m for m in ("gpipe", "1f1b") if m in modes]
    if pipes:
        best = {rate: max(at[(m, rate)]["samples_per_s"] for m in pipes) for rate in rates}
        lines += ["", "Against the best pipeline schedule (samples/s over the faster of GPipe and 1F1B's):", ""]
        lines += head + table(lambda r, rate: "%.2fx" % (r["samples_per_s"] / best[rate]))
    lines += ["", "Wire bytes per sample (the four hosts' eth0 tx_bytes over the whole run, start-up included):", ""]
    lines += head + table(lambda r, rate: "%.0f" % r["wire_bytes_per_sample"])
    if all("cpu_ms_per_sample" in r for r in results):
        lines += ["", "CPU milliseconds per sample (the four hosts' user and system time over the run's samples, "
                  "start-up included):", ""]
        lines += head + table(lambda r, rate: "%.1f" % r["cpu_ms_per_sample"])
    lines += ["", "Link use: each host's mean egress (wire bytes per sample x samples/s / 4) over the link's measured "
              "rate:", ""]
    lines += head + table(lambda r, rate: "%.0f%%" % (100 * r["wire_bytes_per_sample"] * r["samples_per_s"] / HOSTS /
                                                       (links[rate] * 1e6)))
    text = "\n".join(lines)
    print("\n" + text)
    with open(out + ".md", "w") as f:
        f.write("# ATOM peers against pipeline and data parallelism on slow links (CPU, network namespaces)\n\n"
                "`sudo python3 bench/atom_slow_links.py build` at %s, %s. See the script's header for the set-up."
                "\n\n%s\n\n![samples/s against link rate](%s.svg)\n"
                % (measured["commit"], measured["date"], text, os.path.basename(out)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--rates", default="none,1gbit,100mbit,10mbit")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the modes this many times in turn at each rate (tables: the median; ratios per repeat)")
    ap.add_argument("--steps", type=int, help="optimizer steps of every run (default: by mode and rate, steps_for)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/atom_slow_links_cpu"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories (logs, metrics) and say where")
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md and OUT.svg from OUT.json")
    ap.add_argument("--links-only", action="store_true",
                    help="only measure each rate's link and all-reduce, into OUT.json's links_mb_per_s and all_reduce "
                         "(a table measured before these were kept gains them; its runs are not repeated)")
    a = ap.parse_args()
    if a.render:
        with open(a.out + ".json") as f:
            render(json.load(f), a.out)
        return
    if os.geteuid() != 0:
        sys.exit("atom_slow_links.py needs root (ip netns, tc): run it with sudo")
    rates, modes = a.rates.split(","), a.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit("--modes: %r is not one of %s" % (m, ", ".join(MODES)))
    build = os.path.abspath(a.build)
    data = prepared_corpus(build)
    work = tempfile.mkdtemp(prefix="atom_slow_links_")
    key = keygen(build, os.path.join(work, "swarm.key"))
    hosts = Hosts()
    results, links, all_reduce = [], {}, {}
    for rate in rates:
        hosts.set_rate(rate)
        links[rate] = measure_link(work)
        all_reduce[rate] = measure_all_reduce(build, work, rate)
        print("link %s: one host receives %.2f MB/s from another; a ring all-reduce of the %d hosts %.2f MB/s "
              "(bus bandwidth), latency %.0f us" % (rate, links[rate], HOSTS, all_reduce[rate]["bus_mb_per_s"],
                                                   all_reduce[rate]["latency_us"]), flush=True)
        if a.links_only:
            continue
        for repeat, mode in [(k, m) for k in range(a.repeat) for m in modes]:
            r = run(build, work, hosts, mode, rate, data, key, a.steps, repeat)
            results.append(r)
            print("  %-7s %8.1f samples/s  %9.0f wire bytes/sample  (%d steps)"
                  % (mode, r["samples_per_s"], r["wire_bytes_per_sample"], r["steps"]), flush=True)
    if a.links_only:
        with open(a.out + ".json") as f:
            measured = json.load(f)
        measured.update({"links_mb_per_s": links, "all_reduce": all_reduce,
                         "links_measured": "%s at %s" % (time.strftime("%Y-%m-%d"), sh(
                             "git", "-C", ROOT, "rev-parse", "--short", "HEAD").stdout.strip())})
    else:
        measured = {"commit": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD").stdout.strip(),
                    "date": time.strftime("%Y-%m-%d"), "rates": rates, "modes": modes, "links_mb_per_s": links,
                    "all_reduce": all_reduce, "results": results}
    with open(a.out + ".json", "w") as f:
        json.dump(measured, f, indent=1)
    render(measured, a.out)
    if a.keep:
        print("runs kept in " + work)
    else:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
