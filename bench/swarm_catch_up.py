#!/usr/bin/env python3
"""How fast a late joiner catches up with a swarm whose rounds are fast: by state downloads alone
(swarm.replay_mb = 0) against a download and then the rounds it missed replayed from the peers' logs.

    python3 bench/swarm_catch_up.py BUILD_DIR [--rounds 3] [--limit 60] [--rate 8mbit --target-steps 4]

Peer A of tiny_gpt (2 blocks of width 32: tens of milliseconds a local step) trains alone in batch
mode (swarm.target_batch_size = --target-steps local steps of 4 sequences), so its swarm step
advances every few local steps; peer B starts from A's address. Printed per setting and try: the
seconds from B's address to its first round with A ("round N: 2 peers"), or "-" when not within
--limit, and how B caught up (state downloads, rounds replayed), with A's rounds per second from B's
first download to the end of the try. The settings alternate within each try, on the same machine.

With --rate R (needs root: ip netns, tc), A and B are two hosts (network namespaces, as in
atom_slow_links.py) whose links are limited to R with tbf. A round's mean is 4 bytes per parameter
and the state about three times that (parameters and AdamW's two moments), so where one round's
mean crosses the link in less than A's round interval but the state does not, a joiner taking
states alone is always behind when its download ends (the endless chase), while one that replays
the missed rounds gains on A with each.
"""
import argparse
import os
import re
import shutil
import signal
import tempfile
import time

from atom_slow_links import Hosts, host_ip, measure_link
from swarm_peers import keygen, prepared_corpus, start_peer


def settings(build, key, data, target_steps):
    return ["--config", "tiny_gpt", "--set", "data.path=" + data, "--set", "train.steps=1000000",
            "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
            "--set", "model.block_size=32", "--set", "train.seq_len=32", "--set", "train.batch_size=4",
            "--set", "train.threads=1", "--set", "train.log_every=1000", "--set", "eval.every=1000000",
            "--set", "checkpoint.every=1000000", "--set", "swarm.key_file=" + key,
            "--set", "swarm.target_batch_size=%d" % (4 * target_steps), "--set", "swarm.record_ttl_s=2",
            "--set", "swarm.publish_interval_s=0.2", "--set", "swarm.round_timeout_min_s=1",
            "--set", "swarm.round_timeout_max_s=8"]


def one(build, work, replay_mb, limit, target_steps, hosts):
    key = keygen(build, os.path.join(work, "swarm.key"))
    data = prepared_corpus(build)

    def peer(i):  # peer i's command prefix: its host's namespace and address, or loopback
        where = ["ip", "netns", "exec", "tsr%d" % i] if hosts else []
        return where + [os.path.join(build, "tessera"), "peer", "--swarm", "demo", "--listen",
                        (host_ip(i) if hosts else "127.0.0.1") + ":0"]

    a_dir = os.path.join(work, "a")
    replay = ["--set", "swarm.replay_mb=%g" % replay_mb]  # the donor's log is the one B reads
    a, address = start_peer(peer(0) + ["--out", a_dir] + settings(build, key, data, target_steps) + replay, a_dir)
    time.sleep(3)  # A runs ahead alone
    b_dir = os.path.join(work, "b")
    t0 = time.time()
    b, _ = start_peer(peer(1) + ["--out", b_dir, "--initial-peer", address] + settings(build, key, data, target_steps)
                      + replay, b_dir)
    seconds = None
    while time.time() - t0 < limit:
        with open(b_dir + ".log") as f:
            text = f.read()
        if re.search(r"round [0-9]+: 2 peers", text):
            seconds = time.time() - t0
            break
        time.sleep(0.1)
    elapsed = time.time() - t0
    for p in (a, b):
        p.send_signal(signal.SIGKILL)
        p.wait()
    with open(b_dir + ".log") as f:
        text = f.read()
    downloads = len(re.findall(r"took the swarm's state", text))
    replayed = sum(int(n) for n in re.findall(r"\(([0-9]+) round\(s\)\)", text))
    # A's pace while B is live: its rounds from the swarm step of B's first download to its last.
    first = re.search(r"took the swarm's state at swarm step ([0-9]+)", text)
    with open(a_dir + ".log") as f:
        steps = [int(n) for n in re.findall(r"round ([0-9]+): [0-9]+ peers", f.read())]
    pace = (max(steps) - int(first.group(1))) / elapsed if first and steps else float("nan")
    return seconds, downloads, replayed, pace


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=60)
    parser.add_argument("--rate", default="none", help="tbf rate of each host's link (none: both peers on loopback)")
    parser.add_argument("--target-steps", type=int, default=1, help="A's local steps per swarm step")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    hosts = None
    if args.rate != "none":
        hosts = Hosts(2)
        hosts.set_rate(args.rate)
        print("link %s: one host receives %.2f MB/s from the other" % (args.rate, measure_link(tempfile.mkdtemp())))
    print("| try | setting | seconds to B's first round with A | state downloads | rounds replayed | A's rounds/s |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        for name, replay_mb in (("downloads only (swarm.replay_mb = 0)", 0), ("download, then replay (256 MB)", 256)):
            work = tempfile.mkdtemp(prefix="tessera_catch_up_")
            try:
                seconds, downloads, replayed, rate = one(build, work, replay_mb, args.limit, args.target_steps, hosts)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print("| %d | %s | %s | %d | %d | %.1f |" % (r + 1, name, "-" if seconds is None else "%.1f" % seconds,
                                                         downloads, replayed, rate), flush=True)


if __name__ == "__main__":
    main()
