#!/usr/bin/env python3
"""How much of a rate-limited link TCP delivers when each host sends to every other at once,
against one flow at a time (why a swarm round sends in shift order: src/atom/averaging.h).

    sudo python3 bench/link_flows.py [--rates 100mbit,10mbit] [--repeats 3] [--out bench/results/link_flows_cpu]

Four hosts are atom_slow_links.py's network namespaces on tbf links. Each host sends BYTES (a
swarm round's parts and sums for tiny_gpt: 2 x 3/4 x 3.4 MB) and receives as much, in one of three
patterns, all hosts starting together:
  all_at_once  to each of the three others at once, a third each (three TCP flows out and in);
  shift        to host i+1, then i+2, then i+3, a third each, one after another;
  ring         all of it to host i+1 (one flow out, one in);
  shift_lowat  shift, with each socket's unsent bytes limited to 128 KiB (TCP_NOTSENT_LOWAT), so
               a send returns when its bytes are nearly on the wire, not when they are queued in
               the kernel: one flow at a time in fact, where plain shift queues the next host's
               bytes while the last are still going out.
Reports each pattern's seconds (the slowest host) and the share of the link's rate it reached.
Writes OUT.md and OUT.json. Needs root.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from atom_slow_links import ROOT, Hosts, host_ip, rate_bytes

BYTES = 5_100_000
PATTERNS = ("all_at_once", "shift", "ring", "shift_lowat")

WORKER = r'''
import socket, sys, threading, time
me, n, size, pattern, start, ips = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), sys.argv[6].split(",")
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind((ips[me], 5100)); srv.listen(8)
senders = 1 if pattern == "ring" else n - 1
def receive():  # each connection drained from its accept on (a sender waits for its receiver)
    def drain(c):
        while c.recv(1 << 20): pass
    ts = []
    for _ in range(senders):
        ts.append(threading.Thread(target=drain, args=(srv.accept()[0],))); ts[-1].start()
    [t.join() for t in ts]
while time.time() < start: time.sleep(0.001)
r = threading.Thread(target=receive); r.start()
t0 = time.time()
targets = [(me + 1) % n] if pattern == "ring" else [(me + s) % n for s in range(1, n)]
def send(j):
    s = socket.create_connection((ips[j], 5100))
    if pattern == "shift_lowat": s.setsockopt(socket.IPPROTO_TCP, 25, 128 << 10)  # TCP_NOTSENT_LOWAT
    s.sendall(b"x" * (size // len(targets))); s.close()
if pattern == "all_at_once":
    ts = [threading.Thread(target=send, args=(j,)) for j in targets]
    [t.start() for t in ts]; [t.join() for t in ts]
else:
    for j in targets: send(j)
r.join()
print(time.time() - t0)
'''


def one(hosts, pattern, worker):
    start = time.time() + 1.5
    ips = ",".join(host_ip(i) for i in range(hosts.count))
    procs = [subprocess.Popen(["ip", "netns", "exec", "tsr%d" % i, sys.executable, worker, str(i), str(hosts.count),
                               str(BYTES), pattern, str(start), ips], stdout=subprocess.PIPE, text=True)
             for i in range(hosts.count)]
    return max(float(p.communicate()[0]) for p in procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="100mbit,10mbit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/link_flows_cpu"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("link_flows.py needs root (ip netns, tc): run it with sudo")
    hosts = Hosts()
    worker = os.path.join(tempfile.mkdtemp(prefix="link_flows_"), "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    results = []
    for rate in a.rates.split(","):
        hosts.set_rate(rate)
        ideal = BYTES / rate_bytes(rate)
        for r in range(a.repeats):
            for pattern in PATTERNS:  # interleaved, so a slow minute of the machine hits each alike
                seconds = one(hosts, pattern, worker)
                results.append({"rate": rate, "pattern": pattern, "repeat": r, "seconds": seconds, "ideal_s": ideal})
                print("%-8s %-12s %.3f s (%.0f%% of the link)" % (rate, pattern, seconds, 100 * ideal / seconds))
    lines = ["| link | pattern | seconds (each repeat, slowest host) | mean share of the link |", "|---|---|---|---|"]
    for rate in a.rates.split(","):
        for pattern in PATTERNS:
            rows = [r for r in results if r["rate"] == rate and r["pattern"] == pattern]
            share = sum(r["ideal_s"] / r["seconds"] for r in rows) / len(rows)
            lines.append("| %s | %s | %s | %.0f%% |" % (rate, pattern, ", ".join("%.2f" % r["seconds"] for r in rows),
                                                      100 * share))
    with open(a.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("# Several TCP flows at once through a tbf link, against one at a time\n\n"
                "`sudo python3 bench/link_flows.py --rates %s --repeats %d` (see its header). Each host sends and "
                "receives %.1f MB; the share is the link's rate (tbf's) times the slowest host's seconds.\n\n%s\n"
                % (a.rates, a.repeats, BYTES / 1e6, "\n".join(lines)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
